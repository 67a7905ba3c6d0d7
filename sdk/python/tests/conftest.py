"""Starts a real `corral serve` for the whole test session.

The binary is `$CORRAL_BIN`, else `target/debug/corral` or `target/release/corral` (the newer
of the two) under the repository root (the first directory above this file whose Cargo.toml
has `[workspace]`). A missing binary FAILS the tests that need the server: CI builds it first.
The environment is passed through (`CORRAL_DATA_DIR` selects the image store).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Callable, Iterator, Optional

import httpx
import pytest

HEALTH_WAIT_S = 60.0
STOP_WAIT_S = 10.0


def _repo_root() -> Optional[Path]:
    for d in Path(__file__).resolve().parents:
        cargo = d / "Cargo.toml"
        if cargo.is_file() and "[workspace]" in cargo.read_text(errors="replace"):
            return d
    return None


def _corral_bin() -> Path:
    env = os.environ.get("CORRAL_BIN")
    if env:
        path = Path(env)
        if not (path.is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"CORRAL_BIN={env} is not an executable file", pytrace=False)
        return path
    root = _repo_root()
    if root is None:
        pytest.fail(
            "cannot find the repository root (a Cargo.toml with [workspace]) above "
            f"{__file__}; set CORRAL_BIN to the corral binary",
            pytrace=False,
        )
    candidates = [root / "target" / kind / "corral" for kind in ("debug", "release")]
    found = [p for p in candidates if p.is_file() and os.access(p, os.X_OK)]
    if not found:
        pytest.fail(
            "the corral binary does not exist (looked for "
            + " and ".join(str(p) for p in candidates)
            + "): build it first with `cargo build`, or set CORRAL_BIN",
            pytrace=False,
        )
    return max(found, key=lambda p: p.stat().st_mtime)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _tail(path: Path, n: int = 4000) -> str:
    try:
        return path.read_text(errors="replace")[-n:]
    except OSError:
        return "<no log>"


def _stop(proc: "subprocess.Popen[bytes]") -> None:
    if proc.poll() is not None:
        return
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=STOP_WAIT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@contextlib.contextmanager
def serve(tmp: Path, config: str = "") -> Iterator[str]:
    """Runs `corral serve` on a free loopback port with a fresh database in `tmp` and `config`
    (TOML, empty: the defaults) until the block ends; yields its base URL."""
    binary = _corral_bin()
    log_path = tmp / "server.log"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    argv = [str(binary), "serve", "--listen", f"127.0.0.1:{port}", "--db", str(tmp / "corral.db")]
    if config:
        (tmp / "corral.toml").write_text(config)
        argv += ["--config", str(tmp / "corral.toml")]
    env = dict(os.environ)
    env.pop("CORRAL_API_KEY", None)
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + HEALTH_WAIT_S
        while True:
            if proc.poll() is not None:
                pytest.fail(
                    f"`{' '.join(argv)}` exited with {proc.returncode} before it was healthy:\n"
                    + _tail(log_path),
                    pytrace=False,
                )
            try:
                r = httpx.get(f"{url}/healthz", timeout=2.0)
                if r.status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(
                    f"`{' '.join(argv)}` was not healthy after {HEALTH_WAIT_S:.0f} s:\n"
                    + _tail(log_path),
                    pytrace=False,
                )
            time.sleep(0.2)
        yield url
    finally:
        _stop(proc)


@pytest.fixture
def corral_bin() -> Path:
    """The `corral` binary the servers of these tests run."""
    return _corral_bin()


@pytest.fixture
def serve_with(tmp_path: Path) -> Callable[[str], "contextlib.AbstractContextManager[str]"]:
    """[`serve`] for one test: `with serve_with(config) as url:` runs a server of its own."""
    return lambda config: serve(tmp_path, config)


@pytest.fixture(scope="session")
def corral_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a `corral serve` running for this test session, with a fresh database.

    Also sets `CORRAL_URL` (and clears `CORRAL_API_KEY`) so that clients built without `url`
    reach it."""
    with serve(tmp_path_factory.mktemp("corral-server")) as url:
        saved = {k: os.environ.get(k) for k in ("CORRAL_URL", "CORRAL_API_KEY")}
        os.environ["CORRAL_URL"] = url
        os.environ.pop("CORRAL_API_KEY", None)
        try:
            yield url
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v


@pytest.fixture
def anyio_backend() -> str:
    # The async tests use anyio's pytest plugin (anyio comes with httpx) on asyncio.
    return "asyncio"
