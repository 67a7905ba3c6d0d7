"""The async client's processes, code contexts and pause/resume against a real `corral serve`
(see conftest.py), with the errors the server's answers map to."""

from __future__ import annotations

from pathlib import Path
from typing import Any, AsyncIterator, Callable, List

import httpx
import pytest

from corral import (
    AsyncProcessHandle,
    AsyncSandbox,
    InvalidRequestError,
    NotFoundError,
    ProcessOutput,
    RateLimitError,
    SandboxStateError,
)

from corral_testing import create_key

pytestmark = pytest.mark.anyio


@pytest.fixture
async def sb(corral_url: str) -> AsyncIterator[AsyncSandbox]:
    async with AsyncSandbox(corral_url) as sandbox:
        yield sandbox


async def test_a_program_and_its_output(sb: AsyncSandbox) -> None:
    handle = await sb.processes.start("sh", ["-c", "echo out; echo err >&2; exit 3"])
    assert isinstance(handle, AsyncProcessHandle) and handle.pid > 0
    chunks: List[ProcessOutput] = []

    async def on_output(chunk: ProcessOutput) -> None:  # a coroutine callback
        chunks.append(chunk)

    end = await handle.wait(on_output=on_output)
    assert end.exit_code == 3 and end.signal is None and end.lost_bytes == 0
    assert b"".join(c.data for c in chunks if c.stream == "stdout") == b"out\n"
    assert b"".join(c.data for c in chunks if c.stream == "stderr") == b"err\n"


async def test_stdin_list_connect_and_kill(sb: AsyncSandbox) -> None:
    cat = await sb.processes.start("cat", stdin=True, tag="cat", env={"X": "1"})
    listed = {p.pid: p for p in await sb.processes.list()}
    assert listed[cat.pid].tag == "cat" and listed[cat.pid].env == {"X": "1"}
    await cat.send_stdin("hello ")
    await sb.processes.send_stdin(cat.pid, b"world")
    await cat.close_stdin()
    assert b"".join([c.data async for c in cat]) == b"hello world"
    assert (await cat.wait()).exit_code == 0

    ticker = await sb.processes.start("sh", ["-c", "while true; do echo t; sleep 0.1; done"])
    await ticker.disconnect()
    again = await sb.processes.connect(ticker.pid)
    async for chunk in again:
        assert chunk.data.startswith(b"t")
        break
    assert await ticker.kill("SIGTERM") is True
    assert (await again.wait()).signal == 15
    assert await sb.processes.kill(ticker.pid) is False
    assert ticker.pid not in [p.pid for p in await sb.processes.list()]


async def test_a_terminal_and_its_input_bound(sb: AsyncSandbox) -> None:
    term = await sb.processes.start("bash", ["--norc", "-i"], pty=(24, 80))
    await term.resize(30, 90)
    await term.send_stdin("stty size\n")
    seen = b""
    async for chunk in term:
        assert chunk.stream == "pty"
        seen += chunk.data
        if b"30 90" in seen:
            break
    assert await term.kill() is True

    raw = await sb.processes.start("sh", ["-c", "stty raw -echo; exec sleep 600"], pty=(24, 80))
    with pytest.raises(RateLimitError):
        for _ in range(100):  # 1.6 MB; the server holds at most 64 KiB for a program
            await raw.send_stdin(b"x" * 16384)
    assert await raw.kill() is True


async def test_unknown_processes_are_not_found(sb: AsyncSandbox) -> None:
    unknown = 999_999
    with pytest.raises(NotFoundError) as e:
        await sb.processes.send_stdin(unknown, "x")
    assert e.value.code == "process_not_found"
    with pytest.raises(NotFoundError):
        await sb.processes.connect(unknown)
    with pytest.raises(NotFoundError):
        await sb.processes.close_stdin(unknown)
    with pytest.raises(NotFoundError):
        await sb.processes.resize(unknown, 10, 10)
    assert await sb.processes.kill(unknown) is False
    with pytest.raises(InvalidRequestError):
        await sb.processes.kill(unknown, "SIGNOPE")
    with pytest.raises(InvalidRequestError):
        await sb.processes.start("")


async def test_another_key_reaches_no_process(tmp_path: Path, serve_with: Callable[[str], Any]) -> None:
    keys = [create_key(tmp_path / "corral.db", name).secret for name in ("owner", "intruder")]
    with serve_with("") as url:
        async with AsyncSandbox(url, api_key=keys[0]) as owner:
            cat = await owner.processes.start("cat", stdin=True, tag="secret-tag")
            async with httpx.AsyncClient(
                base_url=f"{url}/v1/sandboxes/{owner.id}/processes",
                headers={"Authorization": f"Bearer {keys[1]}"},
            ) as intruder:
                answers = [
                    await intruder.get(""),
                    await intruder.post("", json={"cmd": "true"}),
                    await intruder.post(f"/{cat.pid}/input", json={"data": "planted"}),
                    await intruder.post(f"/{cat.pid}/close-stdin", json={}),
                    await intruder.post(f"/{cat.pid}/signal", json={"signal": "SIGKILL"}),
                    await intruder.post(f"/{cat.pid}/resize", json={"rows": 1, "cols": 1}),
                    await intruder.get(f"/{cat.pid}/output"),
                ]
            # As for an unknown sandbox: the answers do not tell that it exists.
            assert [r.status_code for r in answers] == [404] * len(answers), [
                r.text for r in answers
            ]
            assert all("secret-tag" not in r.text for r in answers)
            with pytest.raises(NotFoundError):
                await AsyncSandbox.connect(owner.id, url, api_key=keys[1])
            # The owner's program is untouched: alive, nothing planted in its input.
            listed = await owner.processes.list()
            assert [(p.pid, p.tag) for p in listed] == [(cat.pid, "secret-tag")]
            await cat.send_stdin("mine")
            await cat.close_stdin()
            assert b"".join([c.data async for c in cat]) == b"mine"


async def test_contexts_and_per_execution_env(sb: AsyncSandbox) -> None:
    ctx = await sb.create_context("python", cwd="/workspace")
    assert ctx.language == "python"
    assert (await sb.run_code("v = 7", context=ctx.id)).error is None
    assert (await sb.run_code("v", context=ctx.id)).text == "7"
    assert (await sb.run_code("'v' in globals()")).text == "False"
    ids = [c.id for c in await sb.list_contexts()]
    assert ids[0] == "default-python" and ctx.id in ids
    await sb.restart_context(ctx.id)
    restarted = await sb.run_code("v", context=ctx.id)
    assert restarted.error is not None and restarted.error.name == "NameError"
    await sb.remove_context(ctx.id)
    assert ctx.id not in [c.id for c in await sb.list_contexts()]
    with pytest.raises(NotFoundError):
        await sb.restart_context(ctx.id)
    with pytest.raises(NotFoundError):
        await sb.remove_context("no-such-context")
    with pytest.raises(InvalidRequestError):
        await sb.create_context("cobol")
    assert (await sb.run_code("import os; os.environ.get('ONE')", env={"ONE": "1"})).text == "'1'"
    assert (await sb.run_code("import os; os.environ.get('ONE')")).text is None


async def test_pause_and_resume(sb: AsyncSandbox) -> None:
    await sb.run_code("kept = 'across the pause'")
    info = await sb.pause()
    assert info.state == "paused" and sb.info.state == "paused"
    with pytest.raises(SandboxStateError) as e:
        await sb.run_code("1")
    assert e.value.code == "sandbox_paused"
    with pytest.raises(SandboxStateError):
        await sb.processes.start("true")
    info = await sb.resume()
    assert info.state == "running"
    assert (await sb.run_code("kept")).text == "'across the pause'"
    with pytest.raises(SandboxStateError) as e:
        await sb.resume()
    assert e.value.code == "sandbox_not_paused"
