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
def corral_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """The base URL of a `corral serve` running for this test session, with a fresh database.

    Also clears `CORRAL_API_KEY`, so that clients built without `api_key` send none. It does not
    set `CORRAL_URL`: the other suites of the same pytest run read it (tests/e2b takes it for a
    server of the caller's); a test that needs it sets it itself."""
    with serve(tmp_path_factory.mktemp("corral-server")) as url, pytest.MonkeyPatch.context() as env:
        env.delenv("CORRAL_API_KEY", raising=False)
        yield url


@pytest.fixture
def anyio_backend() -> str:
    # The async tests use anyio's pytest plugin (anyio comes with httpx) on asyncio.
    return "asyncio"
