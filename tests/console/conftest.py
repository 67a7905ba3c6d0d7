"""A real `corral serve` and a real headless Chromium for the console's tests.

The server is the binary from $CORRAL_BIN or <repo>/target/debug/corral, on a free loopback
port, with a fresh database in a temporary directory holding an operator key and a plain key
(`corral key create`), and the image store of $CORRAL_DATA_DIR. The browser is Debian's
chromium driven through Debian's chromedriver (scripts/setup installs both); nothing is
downloaded. Both are stopped at the end.

Every page the browser opens gets a detector before any of its scripts runs: `alert`,
`confirm` and `prompt` are logged instead of shown, and messages posted to the page are
recorded. A hostile payload proves it ran by logging a marker, posting it to its parent and
top windows (what a script in a sandboxed frame of another origin can still do), setting
`window.__pwned`, or fetching a URL of the test's own beacon server; `console_support.pwned()`
reports anything any of those saw.
"""

import http.server
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60
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


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path, lines=40):
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class Server:
    def __init__(self, url, operator_key, tenant_key, tenant_key_id, binary, db):
        self.url = url
        self.operator_key = operator_key
        self.tenant_key = tenant_key
        self.tenant_key_id = tenant_key_id
        self.binary = binary
        self.db = db

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


def _make_key(binary, db, *extra):
    made = subprocess.run(
        [str(binary), "key", "create", "--db", str(db), *extra],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0:
        pytest.fail(f"`corral key create` failed: {made.stderr.strip()}", pytrace=False)
    key_id = made.stderr.split("created key ", 1)[1].split(" ", 1)[0]
    return made.stdout.strip().splitlines()[-1], key_id


@pytest.fixture(scope="session")
def server(tmp_path_factory):
    binary = pathlib.Path(os.environ.get("CORRAL_BIN") or REPO / "target" / "debug" / "corral")
    if not binary.is_file():
        pytest.fail(
            f"no corral binary at {binary}: build it with `cargo build -p corral` or set "
            "CORRAL_BIN",
            pytrace=False,
        )
    tmp = tmp_path_factory.mktemp("corral-console")
    db = tmp / "corral.db"
    operator_key, _ = _make_key(binary, db, "--name", "ops", "--operator")
    tenant_key, tenant_key_id = _make_key(binary, db, "--name", "tenant")
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "server.log"
    # Sandboxes may ask for names below example.org (test_readings.py: egress totals in the
    # list); the proxy decides on a name before resolving it, so a refused one goes nowhere.
    config = tmp / "corral.toml"
    config.write_text('[network]\nallow = ["*.example.org"]\n')
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--db", str(db),
             "--config", str(config)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"corral serve exited: {_log_tail(log_path)}", pytrace=False)
            try:
                with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                    if r.status == 200:
                        break
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"corral serve did not start: {_log_tail(log_path)}", pytrace=False)
            time.sleep(0.1)
        yield Server(url, operator_key, tenant_key, tenant_key_id, binary, db)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


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
