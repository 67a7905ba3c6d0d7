"""The one-shot runner: `corral_oneshot.py PROGRAM` runs PROGRAM like `python3 PROGRAM`
and, when fd 3 is a socket, reports its final value, figures and exception as frames."""

import py_compile
import shutil
import subprocess
import textwrap

import pytest

from harness import PYTHON, RUNTIME, Kernel, is_png, kernel_env

RUNNER_SOURCE = RUNTIME / "corral_oneshot.py"
RUNNER = str(RUNNER_SOURCE)  # set for each test by `runner`


@pytest.fixture(autouse=True, params=["source", "bytecode"])
def runner(request, tmp_path_factory):
    """Every test runs the runner both ways `corral run` starts it: from its source, and from
    its precompiled bytecode as the script (when the image's bytecode cache has it)."""
    global RUNNER
    RUNNER = str(RUNNER_SOURCE)
    if request.param == "bytecode":
        runtime = tmp_path_factory.mktemp("runtime")
        shutil.copy(RUNTIME / "corral_kernel_lib.py", runtime)
        compiled = runtime / "__pycache__" / "corral_oneshot.cpython.pyc"
        py_compile.compile(
            str(RUNNER_SOURCE),
            cfile=str(compiled),
            doraise=True,
            invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
        )
        RUNNER = str(compiled)


class Run:
    def __init__(self, status, frames, stdout, stderr):
        self.status, self.frames, self.stdout, self.stderr = status, frames, stdout, stderr

    @property
    def results(self):
        return [f for f in self.frames if f["type"] == "result"]

    @property
    def errors(self):
        return [f for f in self.frames if f["type"] == "error"]


def write_program(tmp_path, source, name="program.py"):
    program = tmp_path / name
    program.write_text(textwrap.dedent(source))
    return program


def oneshot(tmp_path, source, *args):
    """Runs `source` in one-shot mode with a socket at fd 3."""
    program = write_program(tmp_path, source)
    kernel = Kernel([PYTHON, RUNNER, str(program), *args], cwd=tmp_path)
    try:
        status = kernel.wait_exit()
        frames = [message for _, message in kernel.frames[kernel.sock]]
        for frame in frames:
            assert frame["id"] == "oneshot", frame
        assert frames and frames[-1]["type"] == "done", frames
        return Run(status, frames, kernel.stdout_text(), kernel.stderr_text())
    finally:
        kernel.kill()


def plain(argv, tmp_path):
    """Runs `argv` with nothing at fd 3; returns (status, stdout, stderr)."""
    done = subprocess.run(argv, cwd=tmp_path, env=kernel_env(), capture_output=True, text=True, timeout=60)
    return done.returncode, done.stdout, done.stderr


def test_print_sends_only_done(tmp_path):
    run = oneshot(tmp_path, "print(1)")
    assert (run.status, run.stdout, run.stderr) == (0, "1\n", "")
    assert run.frames == [{"type": "done", "id": "oneshot", "status": "ok"}]


def test_the_final_expression_is_the_main_result(tmp_path):
    run = oneshot(tmp_path, "x = 20\nx * 2 + 2\n")
    assert run.results == [{"type": "result", "id": "oneshot", "is_main_result": True, "data": {"text/plain": "42"}}]
    assert run.frames[-1]["status"] == "ok"


def test_a_program_of_one_expression_is_its_main_result(tmp_path):
    run = oneshot(tmp_path, "6 * 7")
    assert run.results == [{"type": "result", "id": "oneshot", "is_main_result": True, "data": {"text/plain": "42"}}]
    run = oneshot(tmp_path, "1 / 0")
    assert (run.status, run.stdout, run.stderr) == plain([PYTHON, "program.py"], tmp_path)
    assert run.errors[0]["name"] == "ZeroDivisionError"


def test_a_rich_final_value_uses_the_display_protocol(tmp_path):
    source = """\
        class Rich:
            def __repr__(self): return 'Rich()'
            def _repr_html_(self): return '<b>rich</b>'
            def _repr_markdown_(self): return ('**rich**', {'metadata': 1})
            def _repr_json_(self): return {'a': [1, None]}
            def _repr_mimebundle_(self, include=None, exclude=None): return {'image/svg+xml': '<svg/>'}
        Rich()
        """
    [result] = oneshot(tmp_path, source).results
    assert result["data"] == {
        "text/plain": "Rich()",
        "text/html": "<b>rich</b>",
        "text/markdown": "**rich**",
        "image/svg+xml": "<svg/>",
        "application/json": {"a": [1, None]},
    }


def test_a_dataframe_gives_html(tmp_path):
    run = oneshot(tmp_path, "import pandas as pd\npd.DataFrame({'a': [1, 2]}).describe()")
    [result] = run.results
    assert "<table" in result["data"]["text/html"] and "count" in result["data"]["text/plain"]


def test_open_figures_become_png_results(tmp_path):
    source = """\
        import matplotlib.pyplot as plt
        plt.plot([1, 2, 3])
        plt.show()  # Agg: a no-op, the figure stays open
        plt.figure()
        plt.bar(['a', 'b'], [1, 2])
        print('plotted')
        """
    run = oneshot(tmp_path, source)
    assert run.status == 0 and run.stdout == "plotted\n"
    assert [r["is_main_result"] for r in run.results] == [False, False]
    assert all(is_png(r["data"]["image/png"]) for r in run.results)


def test_an_uncaught_exception_looks_like_python_and_is_reported(tmp_path):
    source = """\
        def fail():
            raise ValueError('bad value')
        print('before')
        fail()
        """
    run = oneshot(tmp_path, source)
    assert (run.status, run.stdout, run.stderr) == plain([PYTHON, "program.py"], tmp_path)
    assert run.stderr.startswith("Traceback (most recent call last):\n") and "corral_oneshot" not in run.stderr
    [error] = run.errors
    assert (error["name"], error["value"]) == ("ValueError", "bad value")
    assert error["traceback"] == run.stderr
    assert run.frames[-1]["status"] == "error"


def test_a_syntax_error_looks_like_python(tmp_path):
    run = oneshot(tmp_path, "x = (1,\n")
    assert (run.status, run.stdout, run.stderr) == plain([PYTHON, "program.py"], tmp_path)
    assert run.errors[0]["name"] == "SyntaxError"


def test_system_exit_sets_the_exit_code(tmp_path):
    run = oneshot(tmp_path, "import sys\nprint('bye')\nsys.exit(3)")
    assert (run.status, run.stdout, run.errors) == (3, "bye\n", [])
    assert run.frames[-1]["status"] == "error"
    run = oneshot(tmp_path, "raise SystemExit('a message')")
    assert (run.status, run.stderr) == (1, "a message\n")
    run = oneshot(tmp_path, "import sys\nsys.exit(0)")
    assert run.status == 0 and run.frames[-1]["status"] == "ok"


def test_the_program_runs_as_main_like_python(tmp_path):
    (tmp_path / "helper.py").write_text("VALUE = 'imported from the program directory'\n")
    source = """\
        import sys, helper
        print(__name__, __file__, sys.argv, sys.path[0], helper.VALUE)
        print(sys.modules['__main__'].__file__ == __file__, __spec__, __package__)
        class Point: pass
        import pickle; pickle.dumps(Point())
        """
    program = write_program(tmp_path, source)
    run = oneshot(tmp_path, source, "--flag", "value")
    assert (run.status, run.stdout, run.stderr) == plain([PYTHON, str(program), "--flag", "value"], tmp_path)


def test_without_a_socket_at_fd_3_the_program_still_runs(tmp_path):
    program = write_program(tmp_path, "import os, sys\nprint(40 + 2)\n40 + 3\nsys.exit(5)")
    assert plain([PYTHON, RUNNER, str(program)], tmp_path) == (5, "42\n", "")


def test_commands_do_not_inherit_the_protocol_socket(tmp_path):
    run = oneshot(tmp_path, "import os\nos.system('test -e /proc/self/fd/3 && echo leaked || echo closed')")
    assert run.stdout == "closed\n"


def test_stdout_streams_line_by_line(tmp_path):
    program = write_program(tmp_path, "import time\nprint('first')\ntime.sleep(1)\nprint('second')")
    kernel = Kernel([PYTHON, RUNNER, str(program)], cwd=tmp_path)
    try:
        assert kernel.wait_exit() == 0
        [(done_at, _)] = kernel.frames[kernel.sock]
        first_at = next(at for at, chunk in kernel.stdout_chunks if b"first" in chunk)
        assert done_at - first_at > 0.8
    finally:
        kernel.kill()


def test_a_plain_program_imports_nothing_heavy(tmp_path):
    # What the kernel imported before the program ran, compared with plain Python.
    source = "import sys\nprint(sorted(m for m in ('IPython', 'json', 'ast', 're', 'corral_kernel_lib') if m in sys.modules))"
    program = write_program(tmp_path, source)
    expected = plain([PYTHON, str(program)], tmp_path)[1]
    assert oneshot(tmp_path, source).stdout == expected


def test_a_missing_program_exits_2(tmp_path):
    status, stdout, stderr = plain([PYTHON, RUNNER, "missing.py"], tmp_path)
    assert status == 2 and "can't open file" in stderr


def test_the_program_is_compiled_as_python_compiles_it(tmp_path):
    # Code objects carry the program's path, a coding cookie and __future__ imports work,
    # __main__ has the loader Python gives a script, and nothing of the runner's compiling (a
    # profile hook) is left behind.
    source = """\
        # -*- coding: latin-1 -*-
        from __future__ import annotations
        import inspect, sys, warnings
        def f(x: undefined_name) -> None:
            return 1 / x
        print(inspect.getsource(f).splitlines()[0], f.__code__.co_filename == __file__)
        print(f.__annotations__, sys.getprofile(), 'é')
        print(type(__loader__), __loader__.name, __loader__.path == __file__)
        warnings.warn('careful')
        f(0)
        """
    program = write_program(tmp_path, source)
    run = oneshot(tmp_path, source)
    assert (run.status, run.stdout, run.stderr) == plain([PYTHON, str(program)], tmp_path)
    assert "def f(x: undefined_name) -> None: True" in run.stdout
    assert "<class '_frozen_importlib_external.SourceFileLoader'> __main__ True" in run.stdout
    assert f'File "{program}", line 5, in f' in run.stderr
    run = oneshot(tmp_path, "")
    assert (run.status, run.stdout, run.stderr) == (0, "", "")
