"""What the E2B suites share to run a `corral serve` of their own (conftest.py's session server,
test_e2b_restart.py's restarted one). A module of its own name: pytest collects several suites'
conftest.py files in one run, so `from conftest import` could find another suite's."""

import pathlib
import socket
import time
import urllib.error
import urllib.request

import pytest

REPO = pathlib.Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 120
STOP_TIMEOUT_S = 60


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _log_tail(path, lines=40):
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def _wait_until_healthy(proc, url, log_path):
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            pytest.fail(
                f"corral serve exited with status {proc.returncode} before answering "
                f"/healthz; its log:\n{_log_tail(log_path)}",
                pytrace=False,
            )
        try:
            with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.1)
    pytest.fail(
        f"corral serve did not answer {url}/healthz within {START_TIMEOUT_S} s; its log:\n"
        f"{_log_tail(log_path)}",
        pytrace=False,
    )
