"""The code policy in the Python runtimes (docs/code-policy.md): the one-shot runner's
`--policy FILE` and the session kernel's `policy` frame refuse code that imports what the
policy forbids before any of it runs, with line numbers, and the import hook refuses what the
pre-check could not see, while libraries import what they need."""

import json
import textwrap

import pytest

from harness import PYTHON, PYTHON_KERNEL, RUNTIME, Kernel

RUNNER = str(RUNTIME / "corral_oneshot.py")


def rules(allowed=None, denied=()):
    return {"allowed_modules": allowed, "denied_modules": list(denied)}


def oneshot(tmp_path, source, policy):
    """Runs `source` under `policy` (module rules) as `corral run` does; returns the exit
    status, the frames, stdout and stderr."""
    program = tmp_path / "program.py"
    program.write_text(textwrap.dedent(source))
    rules_file = tmp_path / "rules.json"
    rules_file.write_text(json.dumps(policy))
    kernel = Kernel([PYTHON, RUNNER, "--policy", str(rules_file), str(program)], cwd=tmp_path)
    try:
        status = kernel.wait_exit()
        frames = [message for _, message in kernel.frames[kernel.sock]]
        return status, frames, kernel.stdout_text(), kernel.stderr_text()
    finally:
        kernel.kill()


def error_of(frames):
    errors = [f for f in frames if f["type"] == "error"]
    assert len(errors) == 1, frames
    return errors[0]


PROGRAM = """\
import numpy as np
print("started")
import socket
def later():
    from os import path
    import subprocess as sp, json
x = __import__("ctypes")
"""


def test_the_pre_check_refuses_the_program_before_any_of_it_runs(tmp_path):
    status, frames, stdout, stderr = oneshot(tmp_path, PROGRAM, rules(["numpy", "json"]))
    assert status == 1
    assert stdout == "", "nothing ran"
    error = error_of(frames)
    assert error["name"] == "PolicyViolation"
    assert error["violations"] == [
        {"line": 3, "module": "socket", "rule": "not_allowed"},
        {"line": 5, "module": "os", "rule": "not_allowed"},
        {"line": 6, "module": "subprocess", "rule": "not_allowed"},
        {"line": 7, "module": "ctypes", "rule": "not_allowed"},
    ]
    assert error["value"] == (
        "line 3: import of 'socket' is not allowed; line 5: import of 'os' is not allowed; "
        "line 6: import of 'subprocess' is not allowed; line 7: import of 'ctypes' is not "
        "allowed (allowed modules: json, numpy). The code was not run."
    )
    assert stderr == f"PolicyViolation: {error['value']}\n" == error["traceback"]
    assert frames[-1] == {"type": "done", "id": "oneshot", "status": "error"}


@pytest.mark.parametrize(
    "source, module, rule",
    [
        ("import os.path", "os.path", "denied"),
        ("from os import path", "os.path", "denied"),
        ("import importlib\nimportlib.import_module('os.path')", "os.path", "denied"),
        ("exec('import os.path')", "os.path", "denied"),
        ("from . import helpers", ".", "relative"),
        ("from ..pkg import x", "..pkg", "relative"),
    ],
)
def test_submodules_literal_dynamic_imports_and_relative_ones_are_seen(tmp_path, source, module, rule):
    _, frames, stdout, _ = oneshot(tmp_path, f"print('ran')\n{source}\n", rules(denied=["os.path"]))
    line = source.count("\n") + 2
    assert error_of(frames)["violations"] == [{"line": line, "module": module, "rule": rule}]
    assert stdout == ""


def test_a_syntax_error_stays_a_syntax_error(tmp_path):
    status, frames, _, _ = oneshot(tmp_path, "import socket\nif:\n", rules(denied=["socket"]))
    assert status == 1
    assert error_of(frames)["name"] == "SyntaxError"
    assert "violations" not in error_of(frames)


def test_what_the_pre_check_cannot_see_the_hook_refuses_at_its_line(tmp_path):
    source = """\
    name = "sock" + "et"
    try:
        __import__(name)
    except ImportError as e:
        print(type(e).__name__, isinstance(e, ModuleNotFoundError), e.name)
    import importlib
    importlib.import_module(name)
    """
    status, frames, stdout, stderr = oneshot(tmp_path, source, rules(["importlib"]))
    assert status == 1
    assert stdout == "PolicyViolation True socket\n"
    error = error_of(frames)
    assert error["violations"] == [{"line": 7, "module": "socket", "rule": "not_allowed"}]
    assert error["value"] == "line 7: import of 'socket' is not allowed (allowed modules: importlib)"
    assert stderr.endswith(f"PolicyViolation: {error['value']}\n")


def test_libraries_import_what_they_need(tmp_path):
    """pandas (allowed) imports numpy (not allowed) and much of the standard library; the
    interpreter imports _strptime for time.strptime; none of that is the program's import."""
    source = """\
    import pandas as pd
    import time, datetime
    print(pd.DataFrame({"a": [1, 2]})["a"].sum())
    print(time.strptime("2020", "%Y").tm_year, datetime.datetime(2020, 1, 2).strftime("%d"))
    """
    status, frames, stdout, stderr = oneshot(tmp_path, source, rules(["pandas", "time", "datetime"]))
    assert (status, stdout) == (0, "3\n2020 02\n"), stderr
    assert frames == [{"type": "done", "id": "oneshot", "status": "ok"}]


def test_a_denied_module_stays_usable_by_the_libraries_that_need_it(tmp_path):
    source = """\
    import http.client
    print(http.client.socket.__name__)
    import socket
    """
    status, frames, stdout, _ = oneshot(tmp_path, source, rules(denied=["socket"]))
    assert error_of(frames)["violations"] == [{"line": 3, "module": "socket", "rule": "denied"}]
    assert stdout == "", "the pre-check saw line 3 before anything ran"
    status, frames, stdout, _ = oneshot(tmp_path, source.replace("import socket\n", ""), rules(denied=["socket"]))
    assert (status, stdout) == (0, "socket\n")


def test_workspace_modules_are_user_code(tmp_path):
    """A module the program writes and imports is checked as the program is."""
    source = """\
    import sys
    sys.path.insert(0, ".")
    open("helper.py", "w").write("import socket\\n")
    import helper
    """
    status, frames, _, _ = oneshot(tmp_path, source, rules(denied=["socket"]))
    assert status == 1
    assert error_of(frames)["violations"] == [{"line": 1, "module": "socket", "rule": "denied"}]


# ---------------------------------------------------------------------------------------
# Sessions


@pytest.fixture
def session(tmp_path):
    kernel = Kernel(PYTHON_KERNEL, cwd=tmp_path)
    kernel.wait_ready()
    kernel.send({"type": "policy", **rules(denied=["socket", "subprocess"])})
    yield kernel
    kernel.kill()


def test_every_cell_is_checked_and_the_state_is_kept(session):
    assert session.execute("x = 41").status == "ok"
    refused = session.execute("x += 1\nimport socket")
    assert refused.status == "error"
    assert refused.errors[0]["name"] == "PolicyViolation"
    assert refused.errors[0]["violations"] == [{"line": 2, "module": "socket", "rule": "denied"}]
    assert session.execute("x + 0").main_result["text/plain"] == "41", "the refused cell did not run"
    # Magics are checked as the calls they become; a nested import too.
    refused = session.execute("%time import subprocess")
    assert refused.errors[0]["violations"][0]["module"] == "subprocess"
    refused = session.execute("def f():\n    import subprocess\n")
    assert refused.errors[0]["violations"] == [{"line": 2, "module": "subprocess", "rule": "denied"}]
    hooked = session.execute("m = 'sub' + 'process'\n__import__(m)")
    assert hooked.errors[0]["name"] == "PolicyViolation"
    assert hooked.errors[0]["violations"] == [{"line": 2, "module": "subprocess", "rule": "denied"}]


def test_a_cell_that_switches_the_policy_off_does_not_switch_off_the_pre_check(session):
    """The hook is in the cells' own interpreter, so a cell can undo it: the obvious ways do
    not reach the pre-check of the cells after it (the docs say what can)."""
    undo = """\
    import builtins, importlib, sys, ast
    sys.meta_path[:] = [f for f in sys.meta_path if type(f).__name__ != "Finder"]
    builtins.__import__ = importlib.__import__
    policy = sys.modules["corral_policy"]
    policy.precheck = policy.refusal = policy._search = lambda *a, **k: []
    ast.parse = lambda *a, **k: ast.Module([], [])
    """
    assert session.execute(textwrap.dedent(undo)).status == "ok"
    # IPython compiles the cells with it too, so this breaks the cell that does it.
    session.execute("builtins.compile = ast.parse")
    refused = session.execute("import socket")
    assert refused.errors[0]["violations"] == [{"line": 1, "module": "socket", "rule": "denied"}]


def test_only_the_first_policy_counts(session):
    session.send({"type": "policy", **rules()})
    assert session.execute("import socket").status == "error"
