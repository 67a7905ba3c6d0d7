"""What the unmodified E2B SDK gets for the calls Corral does not serve, and for killing a
background command (issues 20 and 22).

Every call Corral does not serve fails as E2B fails an operation it does not implement: a
`SandboxException` whose message says it is not supported (Connect RPCs answer the Connect
code `unimplemented`, REST routes HTTP 501), never a `NotFoundException` (which the SDK turns
into "file not found", `exists() == False`, "sandbox not found" or `kill() == False`) and
never a hang. docs/e2b.md lists them.
"""

import httpx
import pytest

from e2b import (
    CommandExitException,
    InvalidArgumentException,
    NotFoundException,
    SandboxException,
)
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


UNSUPPORTED = {
    # the Jupyter plane
    "run_code(language='r')": lambda s: s.run_code("1", language="r"),
    # the control plane
    "fork": lambda s: s.fork(),
    "create_snapshot": lambda s: s.create_snapshot(),
    "Sandbox.list_snapshots": lambda s: Sandbox.list_snapshots().next_items(),
    "Sandbox.delete_snapshot": lambda s: Sandbox.delete_snapshot("snapshot-id"),
    "update_network": lambda s: s.update_network({}),
}


@pytest.mark.parametrize("call", UNSUPPORTED.values(), ids=UNSUPPORTED.keys())
def test_unsupported_calls_say_so(sandbox, call):
    with pytest.raises(SandboxException) as excinfo:
        call(sandbox)
    error = excinfo.value
    assert not isinstance(error, NotFoundException), repr(error)
    assert "not supported by Corral" in str(error), repr(error)
    # The sandbox is untouched and still serves what Corral does serve.
    assert sandbox.is_running()


def test_no_signed_urls_and_no_mcp_gateway(sandbox, corral_server):
    sandbox.files.write("signed.txt", "not through a signed URL")
    for url in (sandbox.download_url("signed.txt"), sandbox.upload_url("signed.txt")):
        assert url.startswith(corral_server + "/"), url
        answer = httpx.get(url, timeout=30)
        assert answer.status_code == 404, url
        assert "not through a signed URL" not in answer.text
    assert f"50005-{sandbox.sandbox_id}" in sandbox.get_mcp_url()
    with pytest.raises(InvalidArgumentException):
        sandbox.get_mcp_token()


def test_git_runs_through_commands_and_the_image_has_none(sandbox):
    with pytest.raises(CommandExitException) as excinfo:
        sandbox.git.init("repo")
    assert excinfo.value.exit_code == 127


def test_killing_a_background_command(sandbox):
    handle = sandbox.commands.run("echo started; sleep 50; echo finished", background=True)
    first = next(iter(handle))  # the command is running
    assert first == ("started\n", None, None)

    assert handle.kill() is True  # SendSignal(SIGKILL) to a running process, as envd answers

    # As envd reports a process killed by SIGKILL (Go's ProcessState): exit code -1.
    with pytest.raises(CommandExitException) as excinfo:
        handle.wait()
    assert excinfo.value.exit_code == -1
    assert excinfo.value.error == "signal: killed"
    assert "finished" not in excinfo.value.stdout

    # A process that has ended is not found: kill() says False.
    assert handle.kill() is False
    assert sandbox.commands.kill(handle.pid) is False
    assert sandbox.commands.kill(987654) is False
    assert sandbox.commands.run("echo next").stdout == "next\n"


def test_killing_a_background_command_kills_only_it(sandbox):
    first = sandbox.commands.run("echo one; sleep 2; echo two", background=True)
    second = sandbox.commands.run("sleep 60", background=True)
    assert first.pid != second.pid

    assert second.kill() is True
    with pytest.raises(CommandExitException) as excinfo:
        second.wait()
    assert excinfo.value.exit_code == -1
    assert excinfo.value.error == "signal: killed"
    assert excinfo.value.stdout == ""

    assert first.wait().stdout == "one\ntwo\n"  # untouched by the other's kill
    assert first.kill() is False


def test_a_command_of_another_sandbox_is_not_found(sandbox):
    other = Sandbox.create()
    try:
        handle = other.commands.run("sleep 30", background=True)
        assert sandbox.commands.kill(handle.pid) is False
        assert handle.kill() is True
        with pytest.raises(CommandExitException):
            handle.wait()
    finally:
        other.kill()
