"""run_code beyond the defaults with the unmodified E2B SDK (issue 22): per-execution envs,
other languages, code contexts."""

import time

import pytest

from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_envs_are_set_for_that_execution_only(sandbox):
    code = "import os, subprocess; print(os.environ.get('CORRAL_E2B'), subprocess.run('echo $CORRAL_E2B', shell=True, capture_output=True, text=True).stdout.strip())"
    with_envs = sandbox.run_code(code, envs={"CORRAL_E2B": "yes"})
    assert with_envs.error is None, with_envs.error
    assert "".join(with_envs.logs.stdout) == "yes yes\n"
    after = sandbox.run_code(code)
    assert "".join(after.logs.stdout) == "None \n"
    js = "process.env.CORRAL_E2B ?? 'unset'"
    assert sandbox.run_code(js, language="js", envs={"CORRAL_E2B": "js"}).text == "js"
    assert sandbox.run_code(js, language="js").text == "unset"
    # A bash context refuses them before anything runs: HTTP 400, which the SDK raises.
    from e2b import SandboxException
    with pytest.raises(SandboxException, match="per-execution environment"):
        sandbox.run_code("echo $CORRAL_E2B > /tmp/ran", language="bash", envs={"CORRAL_E2B": "x"})
    assert sandbox.run_code("test -e /tmp/ran || echo absent", language="bash").logs.stdout == ["absent\n"]


def test_a_client_timeout_stops_the_execution_and_the_sandbox_goes_on(sandbox):
    from e2b import TimeoutException

    with pytest.raises(TimeoutException):
        sandbox.run_code("import time; time.sleep(30)", timeout=1.5)
    started = time.monotonic()
    assert sandbox.run_code("'still here'").text == "still here"
    assert time.monotonic() - started < 20


def test_other_languages_run_in_their_default_contexts(sandbox):
    js = sandbox.run_code("const a = 40; a + 2", language="javascript")
    assert js.error is None, js.error
    assert js.text == "42"
    assert sandbox.run_code("a", language="js").text == "40"  # its state is kept
    sh = sandbox.run_code("echo from-bash; cd /tmp", language="bash")
    assert sh.logs.stdout == ["from-bash\n"]
    assert sandbox.run_code("pwd", language="bash").logs.stdout == ["/tmp\n"]
    # The sandbox's own Python is untouched.
    assert sandbox.run_code("import os; os.getcwd()").text == "/workspace"


def test_code_contexts_are_created_listed_restarted_and_removed(sandbox):
    sandbox.files.write("ctx/data.txt", "shared")
    ctx = sandbox.create_code_context(cwd="/home/user/ctx")
    assert ctx.language == "python" and ctx.cwd == "/home/user/ctx"
    assert sandbox.run_code("x = 1; open('data.txt').read()", context=ctx).text == "shared"
    assert sandbox.run_code("x", context=ctx).text == "1"
    assert sandbox.run_code("'x' in globals()").text == "False"  # another interpreter
    listed = {c.id: c for c in sandbox.list_code_contexts()}
    assert ctx.id in listed and listed[ctx.id].cwd == "/home/user/ctx"

    sandbox.restart_code_context(ctx)
    assert sandbox.run_code("x", context=ctx).error.name == "NameError"

    js_ctx = sandbox.create_code_context(language="javascript")
    assert sandbox.run_code("typeof require", context=js_ctx).text == "function"
    bash_ctx = sandbox.create_code_context(language="bash", cwd="/home/user/ctx")
    assert "".join(sandbox.run_code("cat data.txt; echo", context=bash_ctx).logs.stdout) == "shared\n"
    sandbox.remove_code_context(js_ctx)
    sandbox.remove_code_context(bash_ctx)
    sandbox.remove_code_context(ctx.id)
    ids = {c.id for c in sandbox.list_code_contexts()}
    assert not {ctx.id, js_ctx.id, bash_ctx.id} & ids
