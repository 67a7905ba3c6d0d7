"""What the Python suites share to run the corral binary: finding it, free ports, API keys,
`corral serve` on a fresh database (started, waited for until healthy, stopped with SIGTERM),
other corral processes waited for until they listen, and their logs; and an HTTP server on
the host's loopback that answers "hello", the upstream of the egress tests.

A package of its own name, on `sys.path` through the `pythonpath` setting of the root
pytest.ini (and of sdk/python/pyproject.toml, the SDK's own): pytest collects several suites'
conftest.py files in one run, so no conftest may `from conftest import`.

The binary is `$CORRAL_BIN`, else `target/debug/corral` or `target/release/corral` (the newer of
the two) under the repository root. A missing binary FAILS the tests that need it: CI builds it
first. The environment is passed through (`CORRAL_DATA_DIR` selects the image store), but for
`CORRAL_API_KEY`, which no server started here is meant to see.
"""

from __future__ import annotations

import contextlib
import http.server
import json
import os
import re
import signal
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator, List, Optional, Sequence

import pytest

REPO = Path(__file__).resolve().parents[2]
# Long: the machines that run the suites are busy.
START_WAIT_S = 120.0
STOP_WAIT_S = 60.0


def corral_bin() -> Path:
    """The corral binary the suites run (the module docstring says which)."""
    env = os.environ.get("CORRAL_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"CORRAL_BIN={env} is not an executable file", pytrace=False)
        return path
    candidates = [REPO / "target" / kind / "corral" for kind in ("debug", "release")]
    found = [p for p in candidates if p.is_file() and os.access(p, os.X_OK)]
    if not found:
        pytest.fail(
            "the corral binary does not exist (looked for "
            + " and ".join(str(p) for p in candidates)
            + "): build it first with `cargo build -p corral`, or set CORRAL_BIN",
            pytrace=False,
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port free on `host` now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, chars: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-chars:]
    except OSError:
        return "<no log>"


def child_env() -> dict:
    """The environment of a corral process started here: this one's, without `CORRAL_API_KEY`."""
    return {k: v for k, v in os.environ.items() if k != "CORRAL_API_KEY"}


def health(url: str) -> Optional[dict]:
    """What `GET {url}/healthz` answers, or None if it answers nothing readable."""
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
            return json.loads(r.read()) if r.status == 200 else None
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


def wait_until_healthy(proc: "subprocess.Popen[bytes]", url: str, log: Path) -> None:
    """Until `{url}/healthz` answers 200; fails the test if `proc` ends or START_WAIT_S pass."""
    deadline = time.monotonic() + START_WAIT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"`{' '.join(map(str, proc.args))}` exited with {proc.returncode} before "
                f"answering /healthz; its log:\n{log_tail(log)}",
                pytrace=False,
            )
        if health(url) is not None:
            return
        if time.monotonic() > deadline:
            pytest.fail(
                f"{url}/healthz did not answer within {START_WAIT_S:.0f} s; its log:\n{log_tail(log)}",
                pytrace=False,
            )
        time.sleep(0.1)


def wait_for_port(proc: "subprocess.Popen[bytes]", port: int, log: Path) -> None:
    """Until 127.0.0.1:`port` accepts connections; fails the test if `proc` ends or
    START_WAIT_S pass."""
    deadline = time.monotonic() + START_WAIT_S
    while True:
        if proc.poll() is not None:
            pytest.fail(
                f"`{' '.join(map(str, proc.args))}` exited with {proc.returncode}:\n{log_tail(log)}",
                pytrace=False,
            )
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1.0):
                return
        except OSError:
            pass
        if time.monotonic() > deadline:
            pytest.fail(
                f"`{' '.join(map(str, proc.args))}` did not listen within {START_WAIT_S:.0f} s:\n"
                + log_tail(log),
                pytrace=False,
            )
        time.sleep(0.1)


def stop(proc: "subprocess.Popen[bytes]") -> bool:
    """SIGTERM, then SIGKILL if it has not ended within STOP_WAIT_S. True if it ended on its
    own or on SIGTERM, False if it had to be killed."""
    if proc.poll() is not None:
        return True
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
        return True
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        return False


@dataclass(frozen=True)
class Key:
    id: str
    secret: str


def create_key(db: Path, name: str, operator: bool = False) -> Key:
    """`corral key create` in the database `db` (made if missing)."""
    made = subprocess.run(
        [str(corral_bin()), "key", "create", "--name", name, "--db", str(db)]
        + (["--operator"] if operator else []),
        capture_output=True,
        text=True,
        timeout=60,
    )
    if made.returncode != 0 or not made.stdout.strip():
        pytest.fail(f"`corral key create` failed ({made.returncode}): {made.stderr.strip()}", pytrace=False)
    key_id = re.search(r"created key (key-[0-9a-f]+)", made.stderr)
    if key_id is None:
        pytest.fail(f"`corral key create` named no key: {made.stderr.strip()}", pytrace=False)
    return Key(key_id.group(1), made.stdout.strip().splitlines()[-1])


def add_key(db: Path, key: Key, name: str, operator: bool = False) -> None:
    """`corral key add`: `key` (made on another node) into the database `db`."""
    added = subprocess.run(
        [str(corral_bin()), "key", "add", "--id", key.id, "--name", name, "--db", str(db)]
        + (["--operator"] if operator else []),
        input=key.secret + "\n",
        capture_output=True,
        text=True,
        timeout=60,
    )
    if added.returncode != 0:
        pytest.fail(f"`corral key add` failed ({added.returncode}): {added.stderr.strip()}", pytrace=False)


class Server:
    """`corral serve` on a free loopback port, with the database `dir/corral.db`, the log
    `dir/server.log`, `config` (TOML, written to `dir/corral.toml`; empty: the defaults) and
    `args`. `with Server(...) as s:` starts it and stops it; `start()` and `stop()` do it again
    (on the same port and database)."""

    def __init__(self, dir: Path, config: str = "", args: Sequence[str] = ()) -> None:
        self.dir = dir
        self.db = dir / "corral.db"
        self.log = dir / "server.log"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.args: List[str] = list(args)
        if config:
            (dir / "corral.toml").write_text(config)
            self.args += ["--config", str(dir / "corral.toml")]
        self.proc: Optional["subprocess.Popen[bytes]"] = None

    def create_key(self, name: str, operator: bool = False) -> Key:
        return create_key(self.db, name, operator)

    def start(self) -> None:
        argv = [str(corral_bin()), "serve", "--listen", f"127.0.0.1:{self.port}", "--db", str(self.db), *self.args]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(
                argv, env=child_env(), stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            )
        try:
            wait_until_healthy(self.proc, self.url, self.log)
        except BaseException:
            stop(self.proc)
            raise

    def stop(self) -> None:
        """SIGTERM; fails the test unless it ends with status 0 within STOP_WAIT_S."""
        assert self.proc is not None
        if not stop(self.proc):
            pytest.fail(
                f"corral serve did not stop within {STOP_WAIT_S:.0f} s of SIGTERM; its log:\n"
                + log_tail(self.log),
                pytrace=False,
            )
        if self.proc.returncode != 0:
            pytest.fail(
                f"corral serve ended with status {self.proc.returncode} on SIGTERM; its log:\n"
                + log_tail(self.log),
                pytrace=False,
            )

    def __enter__(self) -> "Server":
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


class _Hello(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:  # noqa: N802 (the standard library's name)
        self.send_response(200)
        self.send_header("Content-Length", "5")
        self.end_headers()
        self.wfile.write(b"hello")

    def log_message(self, *args: object) -> None:
        pass


@contextlib.contextmanager
def hello_server() -> Iterator[int]:
    """An HTTP server on 127.0.0.1 that answers every GET with `hello`, for as long as the
    `with` lasts: its port."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hello)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
