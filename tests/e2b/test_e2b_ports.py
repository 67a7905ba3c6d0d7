"""Ports with the unmodified E2B Python SDK: a server started in the sandbox with
`commands.run(..., background=True)` is reached at the host `get_host(port)` returns, as E2B
builds it (`{port}-{sandboxId}.{domain}`, the domain from the creation's answer: for a server
on loopback `localhost:{its port}`). See docs/e2b.md, "Ports".

A browser resolves `*.localhost` to the loopback itself; Python's resolver here may not, so the
request goes to the server's address with the `Host` that `get_host` gave.
"""

import os
import time
import urllib.parse

import httpx
import pytest

from e2b_code_interpreter import Sandbox


def _fetch(host, path, key):
    """GET http://{host}{path} through the Corral server (the host names it by its port)."""
    server = urllib.parse.urlsplit(os.environ["E2B_API_URL"])
    return httpx.get(
        f"http://{server.hostname}:{server.port}{path}",
        headers={"Host": host, "X-API-KEY": key},
        timeout=30,
    )


@pytest.fixture()
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_get_host_reaches_a_background_http_server(sandbox):
    key = os.environ["E2B_API_KEY"]
    sandbox.files.write("hello.txt", "hello from the sandbox")
    handle = sandbox.commands.run("python3 -m http.server 8000", background=True)
    host = sandbox.get_host(8000)
    server = urllib.parse.urlsplit(os.environ["E2B_API_URL"])
    assert host == f"8000-{sandbox.sandbox_id}.localhost:{server.port}"

    deadline = time.time() + 30
    while True:
        answer = _fetch(host, "/hello.txt", key)
        # 502 port_closed until the server listens.
        if answer.status_code == 200 or time.time() > deadline:
            break
        time.sleep(0.2)
    assert answer.status_code == 200, answer.text
    assert answer.text == "hello from the sandbox"

    # Another port of the same sandbox has nothing listening: a clean 502, at once.
    closed = _fetch(sandbox.get_host(8001), "/", key)
    assert closed.status_code == 502
    assert closed.json()["error"]["code"] == "port_closed"

    # Without the key (the server is not configured with public ports): on a loopback server
    # a keyless request is the tenant `local`, which does not own the sandbox (404); on one
    # that needs keys, 401.
    server = urllib.parse.urlsplit(os.environ["E2B_API_URL"])
    anonymous = httpx.get(
        f"http://{server.hostname}:{server.port}/hello.txt", headers={"Host": host}, timeout=30
    )
    assert anonymous.status_code in (401, 404)
    assert "hello from the sandbox" not in anonymous.text
    handle.kill()


def test_a_paused_sandbox_port_answers_409_and_serves_again_after_connect(sandbox):
    key = os.environ["E2B_API_KEY"]
    sandbox.files.write("page.txt", "still here")
    # Started by code (a background command would do as well): a process the code started
    # lives on, and is frozen with its sandbox.
    started = sandbox.run_code(
        "import subprocess\n"
        "server = subprocess.Popen(['python3', '-m', 'http.server', '8000'],"
        " stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)"
    )
    assert started.error is None
    host = sandbox.get_host(8000)
    deadline = time.time() + 30
    while _fetch(host, "/page.txt", key).status_code != 200:
        last = _fetch(host, "/page.txt", key)
        assert time.time() < deadline, f"the server in the sandbox never answered: {last.status_code} {last.text[:300]}"
        time.sleep(0.2)

    assert sandbox.pause() is True
    started = time.time()
    paused = _fetch(host, "/page.txt", key)
    assert paused.status_code == 409
    assert paused.json()["error"]["code"] == "sandbox_paused"
    assert time.time() - started < 5

    Sandbox.connect(sandbox.sandbox_id)  # resumes it, memory and processes intact
    again = _fetch(host, "/page.txt", key)
    assert again.status_code == 200
    assert again.text == "still here"
