"""Helpers of the MCP tests: the corral binary, free ports, and processes that are waited for
and always stopped. (A module of its own, not conftest.py: several suites run in one pytest
process, and each has a conftest.)

The binary is `$CORRAL_BIN`, else `target/debug/corral` under the repository root; a missing
binary FAILS the tests (CI builds it first). The environment is passed through, so
`CORRAL_DATA_DIR` selects the image store (the `default` image, with pandas and matplotlib).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import List

import pytest

REPO = Path(__file__).resolve().parents[2]
START_WAIT_S = 60.0
STOP_WAIT_S = 15.0


def corral_bin() -> Path:
    env = os.environ.get("CORRAL_BIN")
    path = Path(env) if env else REPO / "target" / "debug" / "corral"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(
            f"the corral binary {path} does not exist: build it first with `cargo build -p corral`, "
            "or set CORRAL_BIN",
            pytrace=False,
        )
    return path


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def wait_for_port(proc: "subprocess.Popen[bytes]", port: int, argv: List[str], log: Path) -> None:
    deadline = time.monotonic() + START_WAIT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(f"`{' '.join(argv)}` exited with {proc.returncode}:\n{_tail(log)}", pytrace=False)
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(f"`{' '.join(argv)}` did not listen within {START_WAIT_S:.0f} s:\n{_tail(log)}",
                        pytrace=False)
        time.sleep(0.1)

