"""Fixtures of the MCP tests (the binary, ports and processes: tests/corral_testing)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path
from typing import Callable, Iterator, List

import pytest

from corral_testing import corral_bin, stop, wait_for_port


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
