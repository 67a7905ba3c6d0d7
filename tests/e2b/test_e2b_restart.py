"""A paused sandbox across a restart of the server, with the unmodified E2B SDK: paused, the
server stopped (SIGTERM) and started again on the same database, `Sandbox.connect(id)` resumes
it on its files with a fresh kernel, and `get_info()` says `"memory": "not kept"`.

This test starts a server of its own (a restart of the shared one would end the other tests'
sandboxes): the binary tests/corral_testing finds, as conftest.py does.
It points the SDK at that server for its duration and back afterwards.
"""

import os

import httpx
import pytest

from e2b_code_interpreter import Sandbox

from corral_testing import Server

@pytest.fixture()
def own_server(tmp_path):
    yield from serve_own(tmp_path)


def serve_own(tmp_path, args=()):
    """A server of this test's own (`corral serve` with `args`), the SDK pointed at it."""
    server = Server(tmp_path, args=args)
    key = server.create_key("restart")
    with server, pytest.MonkeyPatch.context() as env:
        for name, value in [("E2B_API_URL", server.url), ("E2B_SANDBOX_URL", server.url), ("E2B_API_KEY", key.secret)]:
            env.setenv(name, value)
        yield server


def test_a_paused_sandbox_resumes_on_its_files_after_a_restart(own_server):
    sbx = Sandbox.create(metadata={"purpose": "restart"})
    sbx.files.write("notes/kept.txt", "written before the restart")
    assert sbx.run_code("in_memory = 42").error is None
    assert sbx.pause() is True
    own_server.stop()
    own_server.start()

    info = Sandbox.get_info(sbx.sandbox_id)
    assert info.state.value == "paused"
    assert info.metadata == {"purpose": "restart"}
    again = Sandbox.connect(sbx.sandbox_id)  # resumes it: a fresh kernel on the saved files
    assert again.sandbox_id == sbx.sandbox_id
    assert again.files.read("notes/kept.txt") == "written before the restart"
    assert again.run_code("'in_memory' in globals()").text == "False"
    assert again.get_info().state.value == "running"
    # Corral's `memory` is an extra key of the answer `get_info()` parses (its SandboxInfo
    # has no field for it): read from the same route.
    detail = httpx.get(
        f"{own_server.url}/sandboxes/{sbx.sandbox_id}",
        headers={"X-API-KEY": os.environ["E2B_API_KEY"]},
        timeout=30,
    ).json()
    assert detail["memory"] == "not kept"
    # Its commands run (the resumed sandbox's process agent).
    assert again.commands.run("cat notes/kept.txt; echo; pwd").stdout == (
        "written before the restart\n/workspace\n"
    )
    again.kill()
