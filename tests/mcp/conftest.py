"""Fixtures of the MCP tests (helpers in corral_mcp_support.py)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from corral_mcp_support import corral_bin, stop, wait_for_port


@pytest.fixture
def start_listening(tmp_path: Path) -> Iterator[Callable[[List[str], int], None]]:
    """Starts `corral ARGS...` in the background and waits until it accepts connections on
    `port`; every process started is stopped (SIGTERM) when the test ends."""
    procs: List["subprocess.Popen[bytes]"] = []

    def start(args: List[str], port: int) -> None:
        argv = [str(corral_bin()), *args]
        log = tmp_path / f"corral-{len(procs)}.log"
        with open(log, "wb") as out:
            proc = subprocess.Popen(argv, env=dict(os.environ), stdout=out, stderr=subprocess.STDOUT)
        procs.append(proc)
        wait_for_port(proc, port, argv, log)

    try:
        yield start
    finally:
        for proc in procs:
            stop(proc)
