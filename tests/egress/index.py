"""Prints what the host's pip would install from, for the egress end-to-end tests.

Reads the package index from pip's own configuration (`pip config list`: `index-url` from a
file or `PIP_INDEX_URL`), else pip's built-in default, then fetches the index's page for the
package named on the command line (PEP 503) and prints, one per line:

    INDEX <index url>
    HOST <host>          (the index's host, then every host its file links name)

or `UNREACHABLE <why>` when the host itself cannot reach its index. No registry host is
written here: they all come from pip.
"""

import html.parser
import os
import ssl
import subprocess
import sys
import urllib.parse
import urllib.request


def pip_config():
    out = subprocess.run(
        [sys.executable, "-m", "pip", "config", "list"],
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    config = {}
    for line in out.splitlines():
        key, _, value = line.partition("=")
        config[key.split(".")[-1]] = value.strip().strip("'\"")
    return config


def default_index():
    from pip._internal.models.index import PyPI

    return PyPI.simple_url


class Links(html.parser.HTMLParser):
    def __init__(self):
        super().__init__()
        self.hrefs = []

    def handle_starttag(self, tag, attrs):
        if tag == "a":
            self.hrefs.extend(v for k, v in attrs if k == "href" and v)


def main():
    package = sys.argv[1]
    config = pip_config()
    index = config.get("index-url") or default_index()
    print("INDEX", index)
    cafile = config.get("cert") or os.environ.get("PIP_CERT")
    context = ssl.create_default_context(cafile=cafile or None)
    page = urllib.parse.urljoin(index.rstrip("/") + "/", package + "/")
    try:
        with urllib.request.urlopen(page, timeout=15, context=context) as r:
            body = r.read().decode("utf-8", "replace")
            final = r.geturl()
    except Exception as e:  # the host cannot reach its own index: the test is skipped
        print("UNREACHABLE", f"{page}: {e}")
        return
    parser = Links()
    parser.feed(body)
    hosts = [urllib.parse.urlsplit(index).hostname, urllib.parse.urlsplit(final).hostname]
    for href in parser.hrefs:
        host = urllib.parse.urlsplit(urllib.parse.urljoin(final, href)).hostname
        if host:
            hosts.append(host)
    for host in dict.fromkeys(h for h in hosts if h):
        print("HOST", host)


main()
