"""The asynchronous client against a real `corral serve` (anyio's pytest plugin, asyncio)."""

from __future__ import annotations

from typing import List

import pytest

import corral
from corral import AsyncSandbox, CommandExitError, InvalidRequestError, NotFoundError, Result

pytestmark = pytest.mark.anyio


async def test_async_create_run_files_kill(corral_url: str) -> None:
    sb = await AsyncSandbox.create(corral_url)
    try:
        assert sb.id
        assert sb.language == "python"
        assert sb.id in [s.id for s in await AsyncSandbox.list(corral_url)]

        chunks: List[str] = []

        async def on_stdout(text: str) -> None:  # a coroutine callback
            chunks.append(text)

        results: List[Result] = []
        execution = await sb.run_code(
            "x = 20\nprint('hi')\nx * 2 + 2", on_stdout=on_stdout, on_result=results.append
        )
        assert execution.status == "success"
        assert execution.stdout == "hi\n"
        assert "".join(chunks) == "hi\n"  # chunking is the server's choice
        assert execution.text == "42"
        assert results == execution.results
        assert (await sb.run_code("x")).text == "20"

        error = await sb.run_code("1/0")
        assert error.error is not None and error.error.name == "ZeroDivisionError"

        info = await sb.files.write("a/b.txt", "async")
        assert (info.path, info.size) == ("a/b.txt", 5)
        assert await sb.files.read("a/b.txt") == "async"
        assert await sb.files.read("a/b.txt", format="bytes") == b"async"
        assert [f.path for f in await sb.files.list("a")] == ["a/b.txt"]
        await sb.files.remove("a/b.txt")
        with pytest.raises(NotFoundError):
            await sb.files.read("a/b.txt")
        with pytest.raises(InvalidRequestError):
            await sb.files.read("../etc/passwd")

        result = await sb.commands.run("echo hi; exit 3")
        assert (result.stdout, result.exit_code) == ("hi\n", 3)
        with pytest.raises(CommandExitError):
            await sb.commands.run("exit 3", check=True)
    finally:
        assert await sb.kill() is True
        await sb.close()
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect(sb.id, corral_url)


async def test_async_context_manager(corral_url: str) -> None:
    async with AsyncSandbox(corral_url) as sb:
        sid = sb.id
        assert (await sb.run_code("1 + 1")).text == "2"
        other = await AsyncSandbox.connect(sid, corral_url)
        assert other.id == sid
        await other.close()
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect(sid, corral_url)
    with pytest.raises(NotFoundError):
        await sb.run_code("1")

    async with await AsyncSandbox.create(corral_url) as sb2:
        assert (await sb2.run_code("print(1)")).stdout == "1\n"


async def test_async_one_shot(corral_url: str) -> None:
    result = await corral.async_run("print(6*7)", url=corral_url)
    assert result.status == "success"
    assert result.stdout == "42\n"


async def test_async_unknown_sandbox(corral_url: str) -> None:
    with pytest.raises(NotFoundError):
        await AsyncSandbox.connect("sbx-doesnotexist", corral_url)
