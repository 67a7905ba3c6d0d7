"""`corral mcp` driven by the official Python MCP client (`mcp` package), over stdio and over
streamable HTTP: initialize, list tools, state kept across calls, a matplotlib plot as image
content, a file written then read, an exception as a tool error, and the key rule of HTTP."""

from __future__ import annotations

import base64
import os
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, StdioServerParameters
from mcp.client.streamable_http import streamable_http_client

from corral_testing import corral_bin, create_key, free_port

TOOLS = {
    "run_code",
    "create_session",
    "close_session",
    "pause_session",
    "resume_session",
    "write_file",
    "read_file",
    "list_files",
    "run_command",
    "start_process",
    "list_processes",
    "read_process_output",
    "send_process_input",
    "kill_process",
}
CALL_TIMEOUT_S = 120


def texts(result: Any) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


async def exercise(client: Client) -> None:
    """The scenario every transport must pass."""
    listed = await client.list_tools()
    assert {t.name for t in listed.tools} == TOOLS
    run_code = next(t for t in listed.tools if t.name == "run_code")
    assert "plt.show()" in (run_code.description or "")
    assert run_code.input_schema["required"] == ["code"]

    with anyio.fail_after(CALL_TIMEOUT_S):
        # State persists in the connection's default session.
        first = await client.call_tool("run_code", {"code": "x = 20\nprint('set x')"})
        assert not first.is_error, texts(first)
        assert "set x" in texts(first)
        second = await client.call_tool("run_code", {"code": "x + 22"})
        assert not second.is_error, texts(second)
        assert "42" in texts(second)
        assert second.structured_content["status"] == "success"
        assert second.structured_content["results"][0]["text"] == "42"

        # A matplotlib plot comes back as image content (and in the structured result).
        plot = await client.call_tool(
            "run_code",
            {"code": "import matplotlib.pyplot as plt\nplt.plot([1, 3, 2])\nplt.title('t')\nplt.show()"},
        )
        assert not plot.is_error, texts(plot)
        images = [b for b in plot.content if b.type == "image"]
        assert len(images) == 1
        assert images[0].mime_type == "image/png"
        assert base64.b64decode(images[0].data).startswith(b"\x89PNG\r\n\x1a\n")
        assert any("png" in r for r in plot.structured_content["results"])

        # A file written with write_file is read back, listed, and seen by code.
        wrote = await client.call_tool("write_file", {"path": "data/people.csv", "content": "name,age\nAda,36\n"})
        assert not wrote.is_error, texts(wrote)
        read = await client.call_tool("read_file", {"path": "data/people.csv"})
        assert not read.is_error, texts(read)
        assert texts(read) == "name,age\nAda,36\n"
        listed_files = await client.call_tool("list_files", {})
        assert {"path": "data/people.csv", "size": 16} in listed_files.structured_content["files"]
        pandas = await client.call_tool(
            "run_code", {"code": "import pandas as pd\nint(pd.read_csv('data/people.csv').age[0])"}
        )
        assert "36" in texts(pandas), texts(pandas)

        # An exception is a tool error with name, value and traceback: not a protocol error.
        boom = await client.call_tool("run_code", {"code": "def f():\n    return 1 / 0\nf()"})
        assert boom.is_error
        assert "ZeroDivisionError: division by zero" in texts(boom)
        assert "Traceback" in texts(boom) or "----> " in texts(boom)
        assert boom.structured_content["error"]["name"] == "ZeroDivisionError"
        # ...and the session lives on.
        after = await client.call_tool("run_code", {"code": "x"})
        assert "20" in texts(after)

        # Commands share the workspace; a failing one is a tool error.
        cmd = await client.call_tool("run_command", {"cmd": "wc -l < data/people.csv"})
        assert not cmd.is_error and texts(cmd).strip() == "2", texts(cmd)
        failed = await client.call_tool("run_command", {"cmd": "exit 3"})
        assert failed.is_error and failed.structured_content["exit_code"] == 3

        # Tool errors about files (a missing file, a missing directory) keep the default
        # session: its variables and files are still there afterwards.
        kept = await client.call_tool("run_code", {"code": "open('keep.txt', 'w').write('k')\ny = 5"})
        assert not kept.is_error, texts(kept)
        missing = await client.call_tool("read_file", {"path": "nosuch"})
        assert missing.is_error, texts(missing)
        no_dir = await client.call_tool("list_files", {"dir": "nosuchdir"})
        assert no_dir.is_error, texts(no_dir)
        still = await client.call_tool("run_code", {"code": "import os\nprint(sorted(os.listdir('.')))\nx + y"})
        assert not still.is_error, texts(still)
        assert "keep.txt" in texts(still) and "25" in texts(still), texts(still)
        assert "fresh one" not in texts(still), texts(still)

        # Explicit sessions are separate from the default one.
        made = await client.call_tool("create_session", {"language": "python"})
        assert not made.is_error, texts(made)
        sid = made.structured_content["id"]
        fresh = await client.call_tool("run_code", {"code": "'x' in globals()", "session_id": sid})
        assert "False" in texts(fresh), texts(fresh)

        # A paused session keeps its state; meanwhile it runs nothing, and says why.
        await client.call_tool("run_code", {"code": "z = 7", "session_id": sid})
        paused = await client.call_tool("pause_session", {"session_id": sid})
        assert not paused.is_error and paused.structured_content["state"] == "paused", texts(paused)
        refused = await client.call_tool("run_code", {"code": "z", "session_id": sid})
        assert refused.is_error and "paused" in texts(refused), texts(refused)
        resumed = await client.call_tool("resume_session", {"session_id": sid})
        assert not resumed.is_error and resumed.structured_content["state"] == "running", texts(resumed)
        back = await client.call_tool("run_code", {"code": "z", "session_id": sid})
        assert "7" in texts(back), texts(back)
        closed = await client.call_tool("close_session", {"session_id": sid})
        assert not closed.is_error, texts(closed)
        gone = await client.call_tool("run_code", {"code": "1", "session_id": sid})
        assert gone.is_error


def mcp_args(tmp_path: Path) -> list:
    return ["mcp", "--db", str(tmp_path / "c.db"), "--pool-size", "1"]


@pytest.mark.anyio
async def test_stdio(tmp_path: Path) -> None:
    params = StdioServerParameters(command=str(corral_bin()), args=mcp_args(tmp_path), env=dict(os.environ))
    async with Client(params) as client:
        assert client.server_info is None or client.server_info.name == "corral"
        await exercise(client)


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["auto", "legacy"])  # 2026-07-28 stateless, and sessions
async def test_http(tmp_path: Path, start_listening: Any, mode: str) -> None:
    port = free_port()
    start_listening([*mcp_args(tmp_path), "--http", f"127.0.0.1:{port}"], port)
    async with Client(f"http://127.0.0.1:{port}/mcp", mode=mode) as client:
        await exercise(client)


@pytest.mark.anyio
async def test_stdio_through_a_running_server(through_a_server: Any) -> None:
    """`corral mcp --server URL`: the same tools, through `corral serve`'s HTTP API."""
    async with Client(through_a_server()) as client:
        await exercise(client)


@pytest.mark.anyio
async def test_http_off_loopback_requires_a_key(tmp_path: Path, start_listening: Any) -> None:
    db = tmp_path / "c.db"
    key = create_key(db, "mcp-test").secret
    port = free_port()
    # Bound to every address (not loopback): keys are required. Reached here on 127.0.0.1.
    start_listening(["mcp", "--db", str(db), "--pool-size", "0", "--http", f"0.0.0.0:{port}"], port)
    url = f"http://127.0.0.1:{port}/mcp"
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient() as http:
        assert (await http.post(url, json=ping, headers=headers)).status_code == 401
        bad = await http.post(url, json=ping, headers={**headers, "Authorization": "Bearer nope"})
        assert bad.status_code == 401
        assert bad.json()["error"]["code"] == "unauthorized"

    import httpx2  # the HTTP client the mcp package uses

    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {key}"}, timeout=CALL_TIMEOUT_S) as http:
        async with Client(streamable_http_client(url, http_client=http)) as client:
            result = await client.call_tool("run_code", {"code": "6 * 7"})
            assert not result.is_error and "42" in texts(result), texts(result)


@pytest.mark.anyio
async def test_http_refuses_an_authorization_it_cannot_read(tmp_path: Path, start_listening: Any) -> None:
    """Fail closed, as `corral serve` does: on loopback, where a request without a key from a
    local program is the local tenant, an `Authorization` header that is not `Bearer KEY` is
    401, never taken for no key."""
    port = free_port()
    start_listening([*mcp_args(tmp_path), "--http", f"127.0.0.1:{port}"], port)
    url = f"http://127.0.0.1:{port}/mcp"
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
    }
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx.AsyncClient(timeout=CALL_TIMEOUT_S) as http:
        keyless = await http.post(url, json=initialize, headers=headers)
        assert keyless.status_code == 200, keyless.text
        for authorization in ["Basic dXNlcjpwYXNz", "Bearer", "Token abc", "Bearer a b", "bearer"]:
            answer = await http.post(url, json=initialize, headers={**headers, "Authorization": authorization})
            assert answer.status_code == 401, (authorization, answer.status_code, answer.text)
            assert answer.json()["error"]["code"] == "unauthorized", authorization
            assert answer.headers.get("www-authenticate") == "Bearer", authorization
        twice = await http.post(
            url, json=initialize, headers=[*headers.items(), ("Authorization", "Bearer a"), ("Authorization", "Bearer b")]
        )
        assert twice.status_code == 401, twice.text


def test_http_closes_connections_that_send_no_request_head(tmp_path: Path, start_listening: Any) -> None:
    """A connection that sends nothing, or half a head, is closed after `header_timeout_s`, as
    `corral serve` closes it: idle connections hold nothing of the server's for long."""
    port = free_port()
    config = tmp_path / "mcp.toml"
    config.write_text("header_timeout_s = 1\n")
    start_listening([*mcp_args(tmp_path), "--config", str(config), "--http", f"127.0.0.1:{port}"], port)
    import socket
    import time

    for sent in [b"", b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n"]:
        with socket.create_connection(("127.0.0.1", port)) as conn:
            conn.sendall(sent)
            conn.settimeout(10)
            started = time.monotonic()
            try:
                rest = conn.recv(4096)
                while rest and b"408" not in rest:
                    rest = conn.recv(4096)
            except (ConnectionResetError, socket.timeout) as e:
                assert not isinstance(e, socket.timeout), f"still open after 10 s with {sent!r}"
            assert time.monotonic() - started < 8, sent


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def policed(client: Client) -> None:
    """What a model sees of the code policy: code importing a module outside the allowed ones
    is a tool error naming the line and the allowed modules, and nothing of it ran; the
    session's state is kept; bash sessions take only the length."""
    assert not (await client.call_tool("run_code", {"code": "x = 1"})).is_error
    refused = await client.call_tool("run_code", {"code": "x = 2\nimport socket"})
    assert refused.is_error
    assert "line 2: import of 'socket' is not allowed (allowed modules: json, math)" in texts(refused)
    error = refused.structured_content["error"]
    assert error["name"] == "PolicyViolation"
    assert error["violations"] == [{"rule": "not_allowed", "line": 2, "module": "socket"}]
    kept = await client.call_tool("run_code", {"code": "import json\njson.dumps(x)"})
    assert "1" in texts(kept) and not kept.is_error, texts(kept)
    bash = await client.call_tool("run_code", {"code": "echo ok", "language": "bash"})
    assert not bash.is_error and "ok" in texts(bash), texts(bash)


@pytest.mark.anyio
async def test_a_code_policy_holds_in_process_and_through_a_running_server(
    tmp_path: Path, through_a_server: Any
) -> None:
    flags = ["--allow-module", "json,math", "--max-code-bytes", "1000"]
    params = StdioServerParameters(
        command=str(corral_bin()), args=[*mcp_args(tmp_path), *flags], env=dict(os.environ)
    )
    async with Client(params) as client:
        await policed(client)
    async with Client(through_a_server(pool_size=0, flags=flags)) as client:
        await policed(client)


def test_a_policy_that_cannot_be_is_refused_before_anything_starts(tmp_path: Path) -> None:
    done = subprocess.run(
        [str(corral_bin()), *mcp_args(tmp_path), "--allow-module", "os/path"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert '--allow-module: "os/path" is not a module name' in done.stderr
