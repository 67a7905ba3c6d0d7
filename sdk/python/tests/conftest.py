"""Starts a real `corral serve` for the whole test session (tests/corral_testing says which
binary, and how it is started and stopped)."""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Callable, Iterator

import pytest

import corral_testing


@contextlib.contextmanager
def serve(tmp: Path, config: str = "") -> Iterator[str]:
    """Runs `corral serve` on a free loopback port with a fresh database in `tmp` and `config`
    (TOML, empty: the defaults) until the block ends; yields its base URL."""
    with corral_testing.Server(tmp, config) as server:
        yield server.url


@pytest.fixture
def serve_with(tmp_path: Path) -> Callable[[str], "contextlib.AbstractContextManager[str]"]:
    """[`serve`] for one test: `with serve_with(config) as url:` runs a server of its own."""
    return lambda config: serve(tmp_path, config)


@pytest.fixture(scope="session")
def session_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a `corral serve` running for this test session, with a fresh database."""
    with serve(tmp_path_factory.mktemp("corral-server")) as url:
        yield url


@pytest.fixture
def corral_url(session_server: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The session's server (`session_server`), with `CORRAL_URL` set to it and `CORRAL_API_KEY`
    cleared for the test, so that clients built without `url` reach it. For the test only:
    the other suites of the same pytest run read `CORRAL_URL` (tests/e2b takes it for a server
    of the caller's)."""
    monkeypatch.setenv("CORRAL_URL", session_server)
    monkeypatch.delenv("CORRAL_API_KEY", raising=False)
    return session_server


@pytest.fixture
def anyio_backend() -> str:
    # The async tests use anyio's pytest plugin (anyio comes with httpx) on asyncio.
    return "asyncio"
