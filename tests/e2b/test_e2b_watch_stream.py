"""The async SDK's files.watch_dir, which streams (`filesystem.Filesystem/WatchDir`), through
the unmodified E2B SDK; and that the stream is bounded and out of reach of another sandbox's
token (issue 22). The JavaScript SDK's files.watchDir uses the same RPC (tests/e2b-js)."""

import asyncio
import os

import httpx
import pytest

from e2b import FileNotFoundException, InvalidArgumentException, SandboxException
from e2b.sandbox.filesystem.watch_handle import FilesystemEventType
from e2b_code_interpreter import AsyncSandbox


async def wait_for(events, n, timeout_s=10.0):
    deadline = asyncio.get_running_loop().time() + timeout_s
    while len(events) < n:
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"waited for {n} events, saw {events}")
        await asyncio.sleep(0.05)


def test_async_watch_dir_streams_changes():
    async def scenario():
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.make_dir("watched/sub")
            seen = []
            ended = []
            handle = await sbx.files.watch_dir(
                "watched",
                lambda e: seen.append((e.name, e.type)),
                on_exit=ended.append,
            )
            await sbx.files.write("watched/a.txt", "a")
            await wait_for(seen, 1)
            await sbx.files.rename("watched/a.txt", "watched/b.txt")
            await wait_for(seen, 3)
            assert seen == [
                ("a.txt", FilesystemEventType.CREATE),
                ("a.txt", FilesystemEventType.RENAME),
                ("b.txt", FilesystemEventType.CREATE),
            ]
            # Not recursive: nothing of the subdirectory.
            await sbx.files.write("watched/sub/inner.txt", "x")
            await asyncio.sleep(1.0)
            assert len(seen) == 3
            await handle.stop()

            deep = []
            recursive = await sbx.files.watch_dir(
                "/home/user/watched", lambda e: deep.append((e.name, e.type)), recursive=True
            )
            await sbx.commands.run("echo more >> /workspace/watched/sub/inner.txt")
            await wait_for(deep, 1)
            assert deep == [("sub/inner.txt", FilesystemEventType.WRITE)]
            await recursive.stop()

            # A watch ends at its deadline (`timeout`), and says why.
            short = []
            await sbx.files.watch_dir("watched", lambda e: None, on_exit=short.append, timeout=1)
            await wait_for(short, 1, timeout_s=15)
            assert short[0] is not None

            with pytest.raises(FileNotFoundException):
                await sbx.files.watch_dir("no-such-dir", lambda e: None)
            await sbx.files.write("plain.txt", "x")
            with pytest.raises(InvalidArgumentException):
                await sbx.files.watch_dir("plain.txt", lambda e: None)
        finally:
            await sbx.kill()

    asyncio.run(scenario())


def test_streaming_and_polling_watchers_share_the_bound():
    async def scenario():
        sbx = await AsyncSandbox.create()
        try:
            await sbx.files.make_dir("many")
            handles = [await sbx.files.watch_dir("many", lambda e: None) for _ in range(8)]
            with pytest.raises(SandboxException) as excinfo:
                await sbx.files.watch_dir("many", lambda e: None)
            assert "watchers" in str(excinfo.value)
            for h in handles:
                await h.stop()
            # A stopped stream gives its place back once the server sees the client gone.
            for _ in range(100):
                try:
                    h = await sbx.files.watch_dir("many", lambda e: None)
                except SandboxException:
                    await asyncio.sleep(0.1)
                    continue
                await h.stop()
                break
            else:
                raise AssertionError("the stopped watchers kept their places")
        finally:
            await sbx.kill()

    asyncio.run(scenario())


def test_another_sandboxs_token_cannot_watch(corral_server):
    """Sandbox plane: a client with sandbox A's token cannot open a watch on sandbox B, nor
    without a token; the refusal is the 502 of an unknown sandbox."""
    key = os.environ["E2B_API_KEY"]
    with httpx.Client(base_url=corral_server, timeout=30) as client:
        made = []
        try:
            for _ in range(2):
                r = client.post(
                    "/v2/sandboxes",
                    headers={"X-API-KEY": key},
                    json={"templateID": "base", "metadata": {}, "envVars": {}},
                )
                assert r.status_code == 201, r.text
                made.append(r.json())
            a, b = made
            body = b"\x00" + len(b'{"path":""}').to_bytes(4, "big") + b'{"path":""}'
            for headers in (
                {"E2b-Sandbox-Id": b["sandboxID"], "X-Access-Token": a["envdAccessToken"]},
                {"E2b-Sandbox-Id": b["sandboxID"]},
            ):
                r = client.post(
                    "/filesystem.Filesystem/WatchDir",
                    headers={**headers, "Content-Type": "application/connect+json"},
                    content=body,
                )
                assert r.status_code == 502, r.text
                assert b"start" not in r.content
            # The owner's own token opens it (the same request, the right token).
            with client.stream(
                "POST",
                "/filesystem.Filesystem/WatchDir",
                headers={
                    "E2b-Sandbox-Id": b["sandboxID"],
                    "X-Access-Token": b["envdAccessToken"],
                    "Content-Type": "application/connect+json",
                },
                content=body,
            ) as r:
                assert r.status_code == 200
                first = next(r.iter_bytes())
                assert first[0] == 0 and b'"start"' in first
        finally:
            for sbx in made:
                client.delete(f"/sandboxes/{sbx['sandboxID']}", headers={"X-API-KEY": key})
