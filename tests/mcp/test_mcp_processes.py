"""The MCP process tools (start_process, list_processes, read_process_output,
send_process_input, kill_process) driven by the official MCP client over stdio, streamable
HTTP and through a running `corral serve`: a background web server, output read by cursor
with its bounds crossed, input, signals, the per-connection limit, and a second API key that
reaches none of it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from corral_testing import corral_bin, create_key, free_port

CALL_TIMEOUT_S = 120
#: What the server keeps of a program's output, and the most one connection follows.
LOG_KEEP = 256 << 10
MAX_FOLLOWED = 16
READ_DEFAULT = 16 << 10
READ_MAX = 64 << 10

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def texts(result: Any) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


async def call(client: Client, tool: str, args: Dict[str, Any]) -> Any:
    result = await client.call_tool(tool, args)
    assert not result.is_error, f"{tool}: {texts(result)}"
    return result


async def read_to_end(client: Client, pid: int, **extra: Any) -> Tuple[str, Dict[str, Any]]:
    """Everything a program writes until it ends, read by cursor."""
    out, cursor = "", 0
    for _ in range(200):
        r = await call(client, "read_process_output", {"pid": pid, "cursor": cursor, "wait_s": 5, **extra})
        s = r.structured_content
        assert s["cursor"] == cursor and s["skipped_bytes"] == 0, s
        text = texts(r)
        body = text.rsplit("\n[pid ", 1)[0]
        if body != "(no new output)":
            out += body
        cursor = s["next_cursor"]
        if not s["running"] and s["more_bytes"] == 0:
            return out, s
    raise AssertionError(f"pid {pid} did not end: {out[-500:]!r}")


async def exercise(client: Client) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    assert {"start_process", "list_processes", "read_process_output", "send_process_input", "kill_process"} <= names

    # A program that ends: its output (stdout and stderr together) and its exit code.
    started = await call(
        client, "start_process", {"command": "for i in 1 2 3; do echo line$i; sleep 0.3; done; echo err >&2; exit 4"}
    )
    pid = started.structured_content["pid"]
    assert started.structured_content["session_id"]
    out, end = await read_to_end(client, pid)
    assert out.split() == ["line1", "line2", "line3", "err"], out
    assert end["exit_code"] == 4 and end["running"] is False, end
    listed = await call(client, "list_processes", {})
    assert f"pid {pid} exited with code 4" in texts(listed), texts(listed)

    # A web server in the background, reached from code in the same sandbox, then stopped.
    server = await call(client, "start_process", {"command": "exec python3 -m http.server 8000", "cwd": "/workspace"})
    spid = server.structured_content["pid"]
    assert server.structured_content["running"] is True, texts(server)
    await call(client, "write_file", {"path": "index.html", "content": "served by a background program"})
    fetched = await call(
        client,
        "run_code",
        {
            "code": "import time, urllib.request\n"
            "for _ in range(100):\n"
            "    try:\n"
            "        page = urllib.request.urlopen('http://127.0.0.1:8000/index.html').read().decode()\n"
            "        break\n"
            "    except OSError:\n"
            "        time.sleep(0.1)\n"
            "page"
        },
    )
    assert "served by a background program" in texts(fetched), texts(fetched)
    running = await call(client, "list_processes", {})
    assert any(p["pid"] == spid and p["running"] for p in running.structured_content["processes"]), texts(running)
    seen, cursor = "", 0
    for _ in range(20):  # the server logs the request (stderr) after it answered
        log = await call(client, "read_process_output", {"pid": spid, "cursor": cursor, "wait_s": 1})
        seen += texts(log)
        cursor = log.structured_content["next_cursor"]
        if "GET /index.html" in seen:
            break
    assert "GET /index.html" in seen, seen
    killed = await call(client, "kill_process", {"pid": spid, "signal": "SIGTERM"})
    assert "killed by signal 15" in texts(killed), texts(killed)
    after = await call(client, "list_processes", {})
    assert not any(p["pid"] == spid and p["running"] for p in after.structured_content["processes"])

    # Input: to a program with a stdin, then closed.
    cat = await call(client, "start_process", {"command": "cat; echo done", "stdin": True})
    cpid = cat.structured_content["pid"]
    await call(client, "send_process_input", {"pid": cpid, "text": "hello\n"})
    await call(client, "send_process_input", {"pid": cpid, "text": "world\n", "close_stdin": True})
    out, end = await read_to_end(client, cpid)
    assert out == "hello\nworld\ndone\n" and end["exit_code"] == 0, (out, end)

    # Bounds: more output than is kept; reads capped by max_bytes and READ_MAX.
    # In ten pieces a tenth of a second apart, so that the server's reader, even on a busy
    # machine, takes all of it from the sandbox (what it could not take would be lost there,
    # perhaps the end, and counted as lost).
    size = 300_000
    piece = f"head -c {size // 10} /dev/zero | tr '\\0' x"
    big = await call(client, "start_process",
                     {"command": f"for i in 1 2 3 4 5 6 7 8 9 10; do {piece}; sleep 0.1; done; echo; echo END"})
    bpid = big.structured_content["pid"]
    for _ in range(60):
        r = await call(client, "read_process_output", {"pid": bpid, "cursor": 10**12, "wait_s": 1})
        if not r.structured_content["running"]:
            break
    total = r.structured_content["next_cursor"]
    lost = r.structured_content["lost_bytes"]
    assert total + lost == size + len("\nEND\n"), r.structured_content
    first = await call(client, "read_process_output", {"pid": bpid})
    s = first.structured_content
    assert s["cursor"] == total - LOG_KEEP and s["skipped_bytes"] == total - LOG_KEEP, s
    assert s["next_cursor"] - s["cursor"] == READ_DEFAULT and s["more_bytes"] == LOG_KEEP - READ_DEFAULT, s
    assert "are gone" in texts(first)
    most = await call(client, "read_process_output", {"pid": bpid, "cursor": s["cursor"], "max_bytes": 10**9})
    assert most.structured_content["next_cursor"] - s["cursor"] == READ_MAX, most.structured_content
    tail = await call(client, "read_process_output", {"pid": bpid, "cursor": total - 4})
    assert texts(tail).startswith("END\n"), texts(tail)

    # A program that floods its output for as long as it runs: what is kept stays bounded, reads
    # stay capped, and it is stopped.
    flood = await call(client, "start_process", {"command": "exec yes flood"})
    fpid = flood.structured_content["pid"]
    for _ in range(30):
        r = await call(client, "read_process_output", {"pid": fpid, "cursor": 0, "max_bytes": 10**9, "wait_s": 1})
        if r.structured_content["skipped_bytes"] > 4 * LOG_KEEP:
            break
    s = r.structured_content
    assert s["running"] and s["skipped_bytes"] > 4 * LOG_KEEP, s
    assert s["next_cursor"] - s["cursor"] <= READ_MAX and s["more_bytes"] <= LOG_KEEP, s
    assert "are gone" in r.content[0].text, texts(r)
    # The first and last words may be cut; where the sandbox dropped output its reader had not
    # taken in time (a flood outruns it), two pieces of words meet ("flflood"): rare, and
    # nothing but the program's bytes.
    words = r.content[1].text.split()
    inner = words[1:-1]
    assert len(words) > 1000 and set("".join(words)) <= set("flood"), words[:5]
    assert inner.count("flood") >= 0.99 * len(inner), [w for w in inner if w != "flood"][:5]
    stopped = await call(client, "kill_process", {"pid": fpid})
    assert "killed by signal 9" in texts(stopped), texts(stopped)

    # Errors are tool errors the model reads.
    for tool, args in [
        ("read_process_output", {"pid": 999_999}),
        ("kill_process", {"pid": 999_999}),
        ("send_process_input", {"pid": 999_999, "text": "x"}),
        ("send_process_input", {"pid": bpid, "text": "x"}),  # ended
    ]:
        refused = await client.call_tool(tool, args)
        assert refused.is_error, (tool, texts(refused))
    no_stdin = await call(client, "start_process", {"command": "exec sleep 600"})
    refused = await client.call_tool("send_process_input", {"pid": no_stdin.structured_content["pid"], "text": "x"})
    assert refused.is_error and "no stdin" in texts(refused), texts(refused)
    await call(client, "kill_process", {"pid": no_stdin.structured_content["pid"]})

    # At most MAX_FOLLOWED running programs per connection: the next is refused, not started.
    sleepers = []
    for _ in range(MAX_FOLLOWED):
        made = await call(client, "start_process", {"command": "exec sleep 600"})
        sleepers.append(made.structured_content["pid"])
    refused = await client.call_tool("start_process", {"command": "exec sleep 601"})
    assert refused.is_error and f"{MAX_FOLLOWED} running programs" in texts(refused), texts(refused)
    listed = await call(client, "list_processes", {})
    running = [p["pid"] for p in listed.structured_content["processes"] if p["running"]]
    assert sorted(running) == sorted(sleepers), listed.structured_content
    assert "sleep 601" not in texts(listed)
    for pid in sleepers:
        await call(client, "kill_process", {"pid": pid})
    listed = await call(client, "list_processes", {})
    assert not [p for p in listed.structured_content["processes"] if p["running"]], texts(listed)


def mcp_args(tmp_path: Path) -> list:
    return ["mcp", "--db", str(tmp_path / "c.db"), "--pool-size", "1"]


async def test_stdio(tmp_path: Path) -> None:
    params = StdioServerParameters(command=str(corral_bin()), args=mcp_args(tmp_path), env=dict(os.environ))
    async with Client(params) as client:
        await exercise(client)


@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 stateless, and sessions
async def test_http(tmp_path: Path, start_listening: Any, mode: str) -> None:
    port = free_port()
    start_listening([*mcp_args(tmp_path), "--http", f"127.0.0.1:{port}"], port)
    async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode) as client:
        await exercise(client)


async def test_stdio_through_a_running_server(through_a_server: Any) -> None:
    async with Client(through_a_server()) as client:
        await exercise(client)


async def test_another_key_reaches_no_program(tmp_path: Path, start_listening: Any) -> None:
    db = tmp_path / "c.db"
    keys = [create_key(db, name).secret for name in ("owner", "intruder")]
    port = free_port()
    # A warm pool: programs run in sessions forked from its zygote.
    start_listening(["mcp", "--db", str(db), "--pool-size", "1", "--http", f"0.0.0.0:{port}"], port)
    url = f"http://127.0.0.1:{port}/mcp"

    import httpx2  # the HTTP client the mcp package uses

    def client_of(key: str) -> Any:
        return httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=CALL_TIMEOUT_S)

    async with client_of(keys[0]) as http_a, client_of(keys[1]) as http_b:
        async with Client(streamable_http_client(url, http_client=http_a)) as owner:
            cat = await call(owner, "start_process", {"command": "cat", "stdin": True})
            pid, sid = cat.structured_content["pid"], cat.structured_content["session_id"]
            async with Client(streamable_http_client(url, http_client=http_b)) as intruder:
                for tool, args in [
                    ("list_processes", {}),
                    ("read_process_output", {"pid": pid}),
                    ("send_process_input", {"pid": pid, "text": "planted\n"}),
                    ("send_process_input", {"pid": pid, "text": "", "close_stdin": True}),
                    ("kill_process", {"pid": pid}),
                    ("start_process", {"command": "touch /workspace/planted"}),
                ]:
                    answer = await intruder.call_tool(tool, {**args, "session_id": sid})
                    assert answer.is_error, (tool, texts(answer))
                    assert "cat" not in texts(answer), (tool, texts(answer))
                # Its own default session is another sandbox, where the pid names nothing of the owner's.
                own = await intruder.call_tool("kill_process", {"pid": pid})
                assert own.is_error, texts(own)
            # The owner's program is untouched: still running, nothing planted in its input.
            listed = await call(owner, "list_processes", {"session_id": sid})
            assert [p["pid"] for p in listed.structured_content["processes"] if p["running"]] == [pid]
            await call(owner, "send_process_input", {"pid": pid, "text": "mine\n", "close_stdin": True})
            out, end = await read_to_end(owner, pid, session_id=sid)
            assert out == "mine\n" and end["exit_code"] == 0, (out, end)
            files = await call(owner, "list_files", {"session_id": sid})
            assert "planted" not in texts(files), texts(files)
