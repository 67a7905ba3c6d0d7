"""The MCP tools take the server's configured network policy (docs/mcp.md, docs/network.md):
with `[network] default` in the config of `corral mcp`, or of the `corral serve` that
`corral mcp --server` uses, code run by the tools reaches what that default allows, through
the sandbox's proxy, and nothing else; without one, it reaches nothing. No tool argument
widens it. The upstream is a server of the test's on the host's loopback, which the operator's
config opts in (`allow_private`)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Iterator

import pytest
from mcp import Client, StdioServerParameters

from corral_testing import corral_bin, free_port, hello_server

FETCH = """import os, urllib.request
for k in ('NO_PROXY', 'no_proxy'):
    os.environ.pop(k, None)
try:
    print(urllib.request.urlopen('http://{host}/', timeout=20).read().decode())
except Exception as e:
    print('FAILED', e)
"""


@pytest.fixture
def upstream() -> Iterator[int]:
    with hello_server() as port:
        yield port


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def texts(result: Any) -> str:
    return "\n".join(b.text for b in result.content if b.type == "text")


def config(tmp_path: Path, port: int) -> Path:
    path = tmp_path / "corral.toml"
    path.write_text(
        "pool_size = 0\n"
        "[network]\n"
        f'allow = ["localhost:{port}", "*.example.org"]\n'
        'allow_private = ["localhost"]\n'
        f'default = ["localhost:{port}"]\n'
    )
    return path


async def reaches_only_the_default(client: Client, port: int) -> None:
    fetched = await client.call_tool("run_code", {"code": FETCH.format(host=f"localhost:{port}")})
    assert "hello" in texts(fetched), texts(fetched)
    # Allowed by the operator's list but not by its default: a tool argument cannot ask for it.
    refused = await client.call_tool("run_code", {"code": FETCH.format(host="a.example.org")})
    assert "is not on this sandbox's network allow-list" in texts(refused), texts(refused)
    # A command of the session goes through the same proxy.
    script = FETCH.format(host=f"localhost:{port}")
    written = await client.call_tool("write_file", {"path": "fetch.py", "content": script})
    assert not written.is_error, texts(written)
    command = await client.call_tool("run_command", {"cmd": "python3 fetch.py"})
    assert "hello" in texts(command), texts(command)


@pytest.mark.anyio
async def test_the_tools_take_the_configured_default_in_process(tmp_path: Path, upstream: int) -> None:
    args = ["mcp", "--db", str(tmp_path / "c.db"), "--config", str(config(tmp_path, upstream))]
    params = StdioServerParameters(command=str(corral_bin()), args=args, env=dict(os.environ))
    async with Client(params) as client:
        await reaches_only_the_default(client, upstream)


@pytest.mark.anyio
async def test_the_tools_take_the_running_servers_default(
    tmp_path: Path, upstream: int, start_listening: Any
) -> None:
    port = free_port()
    start_listening(
        ["serve", "--listen", f"127.0.0.1:{port}", "--db", str(tmp_path / "s.db"),
         "--config", str(config(tmp_path, upstream))],
        port,
    )
    env = {k: v for k, v in os.environ.items() if k != "CORRAL_API_KEY"}
    args = ["mcp", "--server", f"http://127.0.0.1:{port}"]
    async with Client(StdioServerParameters(command=str(corral_bin()), args=args, env=env)) as client:
        await reaches_only_the_default(client, upstream)


@pytest.mark.anyio
async def test_without_a_default_the_tools_reach_nothing(tmp_path: Path, upstream: int) -> None:
    args = ["mcp", "--db", str(tmp_path / "c.db"), "--pool-size", "0"]
    params = StdioServerParameters(command=str(corral_bin()), args=args, env=dict(os.environ))
    async with Client(params) as client:
        result = await client.call_tool("run_code", {"code": FETCH.format(host=f"localhost:{upstream}")})
        out = texts(result)
        assert "FAILED" in out and "hello" not in out, out
        env = await client.call_tool(
            "run_code", {"code": "import os\nprint(sorted(k for k in os.environ if 'proxy' in k.lower()))"}
        )
        assert "[]" in texts(env), texts(env)
