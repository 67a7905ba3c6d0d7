"""Commands in sandboxes of their own, with the unmodified E2B SDK (issue 22): on a server
without a warm pool (`corral serve --pool-size 0`) no session is forked from a zygote, and a
sandbox resumed after a server restart gets a fresh kernel of its own sandbox; each still has
a process agent, so `commands.run` works as in a forked one.

These tests start a server of their own (test_e2b_restart.py's)."""

import pytest

from e2b import CommandExitException
from e2b_code_interpreter import Sandbox

from test_e2b_restart import serve_own


@pytest.fixture()
def unpooled(tmp_path):
    yield from serve_own(tmp_path, ["--pool-size", "0"])


def test_commands_run_without_a_warm_pool(unpooled):
    sbx = Sandbox.create(envs={"OWN_ENV": "yes"})
    try:
        assert sbx.run_code("open('from-code.txt', 'w').write('code')").error is None
        result = sbx.commands.run("echo $OWN_ENV; id -u; pwd; cat from-code.txt")
        assert result.exit_code == 0
        assert result.stdout == "yes\n1000\n/workspace\ncode"
        sbx.commands.run("echo command > from-command.txt")
        out = sbx.run_code("print(open('from-command.txt').read())").logs.stdout
        assert "".join(out) == "command\n\n"
        with pytest.raises(CommandExitException) as excinfo:
            sbx.commands.run("exit 3")
        assert excinfo.value.exit_code == 3

        handle = sbx.commands.run("sleep 600", background=True)
        assert handle.pid in {p.pid for p in sbx.commands.list()}
        assert sbx.commands.kill(handle.pid) is True
        with pytest.raises(CommandExitException):
            handle.wait()
    finally:
        sbx.kill()


def test_commands_run_after_a_resume_across_a_server_restart(unpooled):
    sbx = Sandbox.create()
    sbx.files.write("kept.txt", "written before the restart")
    assert sbx.pause() is True
    unpooled.stop()
    unpooled.start()
    again = Sandbox.connect(sbx.sandbox_id)  # a fresh kernel of its own sandbox
    try:
        result = again.commands.run("cat kept.txt; id -u")
        assert result.stdout == "written before the restart1000\n"
    finally:
        again.kill()
