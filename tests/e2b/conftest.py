"""The Corral server the E2B SDK tests talk to.

With CORRAL_URL set (and CORRAL_API_KEY, when that server needs a key), the tests use that
server. Otherwise this starts one: the binary from $CORRAL_BIN or <repo>/target/debug/corral
(build it with `cargo build -p corral`), a fresh database in a temporary directory, a key made
with `corral key create`, and the image store of $CORRAL_DATA_DIR (passed through). The server
is stopped with SIGTERM at the end.
"""

import os
import pathlib
import signal
import subprocess

import pytest

from e2b_server import REPO, STOP_TIMEOUT_S, _free_port, _log_tail, _wait_until_healthy


def _point_sdk_at(url, key):
    # The SDK reads these when each request's connection config is built. An http:// URL is
    # what makes it speak plain HTTP; E2B_DEBUG must stay off (in debug mode the SDK skips
    # POST /v2/sandboxes and DELETE entirely).
    os.environ["E2B_API_URL"] = url
    os.environ["E2B_SANDBOX_URL"] = url
    os.environ["E2B_API_KEY"] = key
    os.environ["E2B_DEBUG"] = "false"
    os.environ.pop("E2B_DOMAIN", None)


@pytest.fixture(scope="session", autouse=True)
def corral_server(tmp_path_factory):
    """The base URL of the server under test; the SDK is pointed at it."""
    url = os.environ.get("CORRAL_URL", "").rstrip("/")
    if url:
        _point_sdk_at(url, os.environ.get("CORRAL_API_KEY", "corral-missing-api-key"))
        yield url
        return

    binary = pathlib.Path(os.environ.get("CORRAL_BIN") or REPO / "target" / "debug" / "corral")
    if not binary.is_file():
        pytest.fail(
            f"no corral binary at {binary}: build it with `cargo build -p corral`, set "
            "CORRAL_BIN, or point CORRAL_URL at a running server",
            pytrace=False,
        )
    tmp = tmp_path_factory.mktemp("corral-server")
    db = tmp / "corral.db"
    made = subprocess.run(
        [str(binary), "key", "create", "--name", "e2b-test", "--db", str(db)],
        capture_output=True,
        text=True,
    )
    if made.returncode != 0 or not made.stdout.strip():
        pytest.fail(
            f"`corral key create` failed ({made.returncode}): {made.stderr.strip()}",
            pytrace=False,
        )
    key = made.stdout.strip().splitlines()[-1]

    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    log_path = tmp / "server.log"
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(
            [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--db", str(db)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
    try:
        _wait_until_healthy(proc, url, log_path)
        _point_sdk_at(url, key)
        yield url
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
                pytest.fail(
                    f"corral serve did not stop within {STOP_TIMEOUT_S} s of SIGTERM; "
                    f"its log:\n{_log_tail(log_path)}",
                    pytrace=False,
                )
