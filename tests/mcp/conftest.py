"""Fixtures of the MCP tests (the binary, ports and processes: tests/corral_testing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator, List, Sequence

import pytest
from mcp import StdioServerParameters

from corral_testing import child_env, corral_bin, free_port, stop, wait_for_port


@pytest.fixture
def start_listening(tmp_path: Path) -> Iterator[Callable[[List[str], int], None]]:
    """Starts `corral ARGS...` in the background and waits until it accepts connections on
    `port`; every process started is stopped (SIGTERM) when the test ends."""
    procs: List["subprocess.Popen[bytes]"] = []

    def start(args: List[str], port: int) -> None:
        log = tmp_path / f"corral-{len(procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(
                [str(corral_bin()), *args], env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT
            )
        procs.append(proc)
        wait_for_port(proc, port, log)

    try:
        yield start
    finally:
        for proc in procs:
            stop(proc)


@pytest.fixture
def through_a_server(
    tmp_path: Path, start_listening: Callable[[List[str], int], None]
) -> Callable[..., StdioServerParameters]:
    """`through_a_server(pool_size, flags)` starts `corral serve` (a fresh database, a warm pool
    of `pool_size`) and gives the parameters of a `corral mcp --server` at it (with `flags`),
    run without `CORRAL_API_KEY`: a loopback client with no key."""

    def params(pool_size: int = 1, flags: Sequence[str] = ()) -> StdioServerParameters:
        port = free_port()
        serve = ["serve", "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "s.db"), "--pool-size", str(pool_size)]
        start_listening(serve, port)
        args = ["mcp", "--server", f"http://127.0.0.1:{port}", *flags]
        return StdioServerParameters(command=str(corral_bin()), args=args, env=child_env())

    return params
