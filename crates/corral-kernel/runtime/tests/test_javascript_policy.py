"""The code policy in the JavaScript runtimes (docs/code-policy.md): corral_policy.js as the
session kernel's library (`policy` frame) and as the preload of a one-shot run."""

import json
import shutil
import textwrap

import pytest

from harness import JS_KERNEL, NODE, RUNTIME, Kernel

# A package of the host's Node that requires another one (balanced-match) itself.
BRACE_EXPANSION = "/usr/lib/node_modules/npm/node_modules/brace-expansion"


def rules(allowed=None, denied=()):
    return {"allowed_modules": allowed, "denied_modules": list(denied)}


@pytest.fixture
def session(tmp_path):
    kernel = Kernel(JS_KERNEL, cwd=tmp_path)
    kernel.wait_ready()
    kernel.send({"type": "policy", **rules(["path", "brace-expansion"], ["child_process"])})
    yield kernel
    kernel.kill()


def test_every_cell_is_checked_before_it_runs(session):
    assert session.execute("let x = 41").status == "ok"
    refused = session.execute("x += 1\nconst fs = require('node:fs')\nimport('child_process')")
    assert refused.status == "error"
    error = refused.errors[0]
    assert error["name"] == "PolicyViolation"
    assert error["violations"] == [
        {"line": 2, "module": "fs", "rule": "not_allowed"},
        {"line": 3, "module": "child_process", "rule": "denied"},
    ]
    assert error["value"] == (
        "line 2: import of 'fs' is not allowed; line 3: import of 'child_process' is denied "
        "(allowed modules: brace-expansion, path; denied modules: child_process). "
        "The code was not run."
    )
    assert session.execute("x").main_result["text/plain"] == "41", "the refused cell did not run"
    assert session.execute("require('path').join('a', 'b')").main_result["text/plain"] == "'a/b'"


def test_a_require_the_pre_check_cannot_see_is_refused_when_it_runs(session):
    run = session.execute("const name = 'f' + 's'\n\nrequire(name)")
    error = run.errors[0]
    assert error["name"] == "PolicyViolation"
    assert error["violations"] == [{"line": 3, "module": "fs", "rule": "not_allowed"}]
    caught = session.execute("try { require('o' + 's') } catch (e) { e.code }")
    assert caught.main_result["text/plain"] == "'MODULE_NOT_FOUND'"


def test_packages_require_what_they_need_and_user_files_are_checked(session, tmp_path):
    run = session.execute(f"require('{BRACE_EXPANSION}').expand('a{{b,c}}')")
    assert run.main_result["application/json"] == ["ab", "ac"], run.errors
    (tmp_path / "helper.js").write_text("module.exports = require('os').hostname()\n")
    run = session.execute("require('./helper.js')")
    assert run.errors[0]["violations"] == [{"line": 1, "module": "os", "rule": "not_allowed"}]


def oneshot(tmp_path, source, policy, name="program.js"):
    """Runs `source` as `corral run` does under a policy: the preload beside its rules."""
    runtime = tmp_path / "runtime"
    runtime.mkdir()
    shutil.copy(RUNTIME / "corral_policy.js", runtime)
    (runtime / "corral_code_policy.json").write_text(json.dumps(policy))
    program = tmp_path / name
    program.write_text(textwrap.dedent(source))
    argv = [NODE, "--expose-internals", "--require", str(runtime / "corral_policy.js"), str(program)]
    kernel = Kernel(argv, cwd=tmp_path)
    try:
        status = kernel.wait_exit()
        frames = [message for _, message in kernel.frames[kernel.sock]]
        return status, frames, kernel.stdout_text(), kernel.stderr_text()
    finally:
        kernel.kill()


def test_a_one_shot_program_is_refused_before_it_runs(tmp_path):
    source = """\
    console.log('started');
    import { readFileSync } from 'fs';
    export * from '@scope/pkg/sub';
    """
    status, frames, stdout, stderr = oneshot(tmp_path, source, rules(["path"]), "program.mjs")
    assert (status, stdout) == (1, "")
    error, done = frames
    assert error["violations"] == [
        {"line": 2, "module": "fs", "rule": "not_allowed"},
        {"line": 3, "module": "@scope/pkg", "rule": "not_allowed"},
    ]
    assert stderr == f"PolicyViolation: {error['value']}\n" == error["traceback"]
    assert done == {"type": "done", "id": "oneshot", "status": "error"}


def test_a_one_shot_program_that_passes_runs_under_the_hook_without_fd_3(tmp_path):
    source = """\
    const fs = require('fs');
    try { fs.fstatSync(3); console.log('fd 3 open') } catch { console.log('fd 3 closed') }
    require('child_' + 'process');
    """
    status, frames, stdout, stderr = oneshot(tmp_path, source, rules(denied=["child_process"]))
    assert (status, frames, stdout) == (1, [], "fd 3 closed\n")
    assert "PolicyViolation: line 3: import of 'child_process' is denied" in stderr
