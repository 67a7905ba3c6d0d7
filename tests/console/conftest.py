"""A real `corral serve` and a real headless Chromium for the console's tests.

The server is `corral serve` as tests/corral_testing runs it (the binary from $CORRAL_BIN or
the repository's target directory, a free loopback port, a fresh database in a temporary
directory, the image store of $CORRAL_DATA_DIR), its database holding an operator key and a
plain key (`corral key create`). The browser is Debian's chromium driven through Debian's
chromedriver (scripts/setup installs both); nothing is downloaded. Both are stopped at the end.

Every page the browser opens gets a detector before any of its scripts runs: `alert`,
`confirm` and `prompt` are logged instead of shown, and messages posted to the page are
recorded. A hostile payload proves it ran by logging a marker, posting it to its parent and
top windows (what a script in a sandboxed frame of another origin can still do), setting
`window.__pwned`, or fetching a URL of the test's own beacon server; `console_support.pwned()`
reports anything any of those saw.
"""

import http.server
import os
import shutil
import threading
import urllib.error
import urllib.request

import pytest

import corral_testing

CHROMIUM = os.environ.get("CORRAL_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CORRAL_CHROMEDRIVER", "/usr/bin/chromedriver")

# Installed in every frame before its own scripts (DevTools'
# Page.addScriptToEvaluateOnNewDocument): dialogs are recorded, not shown.
DETECTOR = """
(() => {
  // A payload in a frame of another origin (a sandboxed frame's) cannot touch this window,
  // but can post to it.
  window.__pwnMessages = [];
  window.addEventListener("message", (e) => {
    if (String(e.data).includes("PWNED-" + "FIRED")) window.__pwnMessages.push(String(e.data));
  });
  for (const name of ["alert", "confirm", "prompt", "print"]) {
    window[name] = (...args) => { console.log("PWNED-" + "FIRED dialog " + name + " " + args.join(" ")); };
  }
})();
"""


class Server(corral_testing.Server):
    """The console's server, with an operator key and a plain key."""

    def __init__(self, dir):
        # Sandboxes may ask for names below example.org (test_readings.py: egress totals in the
        # list); the proxy decides on a name before resolving it, so a refused one goes nowhere.
        super().__init__(dir, config='[network]\nallow = ["*.example.org"]\n')
        self.operator_key = self.create_key("ops", operator=True).secret
        tenant = self.create_key("tenant")
        self.tenant_key, self.tenant_key_id = tenant.secret, tenant.id

    def call(self, method, path, key=None, body=None, headers=None):
        """(status, headers, body bytes) of one request."""
        request = urllib.request.Request(self.url + path, method=method, data=body)
        for name, value in (headers or {}).items():
            request.add_header(name, value)
        if key:
            request.add_header("Authorization", f"Bearer {key}")
        if body is not None:
            request.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(request, timeout=60) as r:
                return r.status, r.headers, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.headers, e.read()


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    with Server(tmp_path_factory.mktemp("corral-console")) as s:
        yield s


class Beacon:
    """An HTTP server of the test's own that records every request: a payload that runs and
    reaches it (`/hit`, `/img`) proves it ran. Its pages are another origin than the
    console's, with no policy."""

    def __init__(self):
        hits = self.hits = []

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):
                hits.append(self.path)
                body = b"<!doctype html><title>beacon</title>"
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture(scope="session")
def beacon():
    b = Beacon()
    yield b
    b.close()


@pytest.fixture(scope="session")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    for path in (CHROMIUM, CHROMEDRIVER):
        if not shutil.which(path):
            pytest.fail(
                f"{path} is missing: run scripts/setup (it installs Debian's chromium and "
                "chromium-driver)",
                pytrace=False,
            )
    downloads = tmp_path_factory.mktemp("downloads")
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in (
        "--headless=new",
        "--no-sandbox",  # as root in CI; the page is the test's own server
        "--disable-dev-shm-usage",
        "--window-size=1440,1100",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        # Sandboxed frames in the page's process, so that their console is in the log.
        "--disable-features=IsolateSandboxedIframes",
        "--disable-site-isolation-trials",
        f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}",
    ):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    options.set_capability("unhandledPromptBehavior", "ignore")
    driver = webdriver.Chrome(options=options, service=Service(executable_path=CHROMEDRIVER))
    driver.execute_cdp_cmd(
        "Page.addScriptToEvaluateOnNewDocument", {"source": DETECTOR, "runImmediately": True}
    )
    driver.execute_cdp_cmd(
        "Browser.setDownloadBehavior",
        {"behavior": "allow", "downloadPath": str(downloads), "eventsEnabled": True},
    )
    driver.downloads = downloads
    driver.seen_logs = []
    try:
        yield driver
    finally:
        driver.quit()
