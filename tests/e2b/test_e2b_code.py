"""run_code beyond the defaults with the unmodified E2B SDK (issue 22): per-execution envs."""

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
    assert with_envs.logs.stdout == ["yes yes\n"]
    after = sandbox.run_code(code)
    assert after.logs.stdout == ["None \n"]
