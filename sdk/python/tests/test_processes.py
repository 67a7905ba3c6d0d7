"""`sandbox.processes` against a real `corral serve` (see conftest.py): programs beside the
interpreter, with stdin and a terminal, listed, connected to and signalled."""

from __future__ import annotations

import threading
import time
from typing import Iterator

import pytest

from corral import RateLimitError, Sandbox


@pytest.fixture
def sb(corral_url: str) -> Iterator[Sandbox]:
    with Sandbox(corral_url) as sandbox:
        yield sandbox


def test_a_program_runs_beside_code(sb: Sandbox) -> None:
    cell = threading.Thread(target=lambda: sb.run_code("import time; time.sleep(3)"))
    cell.start()
    time.sleep(0.5)
    started = time.monotonic()
    handle = sb.processes.start("sh", ["-c", "echo out; echo err >&2; exit 3"])
    chunks = []
    end = handle.wait(on_output=chunks.append)
    assert time.monotonic() - started < 2.0
    cell.join()
    assert end.exit_code == 3 and end.signal is None and end.lost_bytes == 0
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"


def test_stdin_list_connect_and_kill(sb: Sandbox) -> None:
    cat = sb.processes.start("cat", stdin=True, tag="cat", env={"X": "1"})
    listed = {p.pid: p for p in sb.processes.list()}
    assert listed[cat.pid].tag == "cat" and listed[cat.pid].env == {"X": "1"}
    cat.send_stdin("hello ")
    sb.processes.send_stdin(cat.pid, b"world")
    cat.close_stdin()
    assert b"".join(c.data for c in cat) == b"hello world"
    assert cat.wait().exit_code == 0

    ticker = sb.processes.start("sh", ["-c", "while true; do echo t; sleep 0.1; done"])
    ticker.disconnect()
    again = sb.processes.connect(ticker.pid)
    assert next(iter(again)).data.startswith(b"t")
    assert ticker.kill("SIGTERM") is True
    assert again.wait().signal == 15
    assert sb.processes.kill(ticker.pid) is False


def test_a_terminal_and_its_input_bound(sb: Sandbox) -> None:
    term = sb.processes.start("bash", ["--norc", "-i"], pty=(24, 80))
    term.send_stdin("stty size\n")
    seen = b""
    for chunk in term:
        assert chunk.stream == "pty"
        seen += chunk.data
        if b"24 80" in seen:
            break
    term.resize(30, 90)
    term.send_stdin("stty size\n")
    for chunk in term:
        seen += chunk.data
        if b"30 90" in seen:
            break
    assert term.kill() is True

    raw = sb.processes.start("sh", ["-c", "stty raw -echo; exec sleep 600"], pty=(24, 80))
    time.sleep(0.5)
    with pytest.raises(RateLimitError):
        for _ in range(100):
            raw.send_stdin(b"x" * 16384)
    assert raw.kill() is True


def test_contexts_and_per_execution_env(sb: Sandbox) -> None:
    sb.run_code("open('shared.txt', 'w').write('hi')")
    js = sb.run_code("require('fs').readFileSync('shared.txt', 'utf8')", language="javascript")
    assert js.text == "'hi'", js
    ctx = sb.create_context("python", cwd="/workspace")
    assert sb.run_code("v = 7", context=ctx.id).error is None
    assert sb.run_code("v", context=ctx.id).text == "7"
    assert sb.run_code("'v' in globals()").text == "False"
    ids = [c.id for c in sb.list_contexts()]
    assert ids[0] == "default-python" and ctx.id in ids and "default-javascript" in ids
    sb.restart_context(ctx.id)
    assert sb.run_code("v", context=ctx.id).error.name == "NameError"
    sb.remove_context(ctx.id)
    assert ctx.id not in [c.id for c in sb.list_contexts()]
    r = sb.run_code("import os; os.environ.get('ONE')", env={"ONE": "1"})
    assert r.text == "'1'"
    assert sb.run_code("import os; os.environ.get('ONE')").text is None
