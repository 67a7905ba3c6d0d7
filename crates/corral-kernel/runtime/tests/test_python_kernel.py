"""The Python session kernel (corral_kernel.py without arguments), as the host drives it."""

import json
import re
import textwrap

from harness import PYTHON, PYTHON_KERNEL, RUNTIME, Kernel, is_png, kernel_env

ANSI_ESCAPE = "\x1b["


def test_ready_names_the_language_and_version(python_kernel):
    assert python_kernel.ready["language"] == "python"
    assert python_kernel.ready["version"].count(".") == 2


def test_state_persists_across_executions(python_kernel):
    first = python_kernel.execute("counter = 41")
    assert first.status == "ok" and first.results == []
    second = python_kernel.execute("counter + 1")
    assert second.status == "ok"
    assert second.main_result == {"text/plain": "42"}
    assert second.messages[-1] == {"type": "done", "id": second.id, "status": "ok"}


def test_stdout_streams_while_the_cell_runs(python_kernel):
    run = python_kernel.execute("import time\nprint('first')\ntime.sleep(1)\nprint('second')")
    assert run.stdout == "first\nsecond\n"
    first_at = next(at for at, chunk in run.stdout_chunks if b"first" in chunk)
    assert run.done_at - first_at > 0.8, "the first line waited for the end of the cell"


def test_stderr_and_subprocess_output_reach_the_pipes(python_kernel):
    code = textwrap.dedent(
        """\
        import os, subprocess, sys
        print('to stderr', file=sys.stderr)
        os.system('echo from os.system')
        subprocess.run(['sh', '-c', 'echo child out; echo child err >&2'])
        !echo from a shell escape
        """
    )
    run = python_kernel.execute(code)
    assert run.status == "ok", run.errors
    assert run.stdout == "from os.system\nchild out\nfrom a shell escape\n"
    assert run.stderr == "to stderr\nchild err\n"


def test_commands_do_not_inherit_the_protocol_socket(python_kernel):
    run = python_kernel.execute("import os\nos.system('test -e /proc/self/fd/3 && echo leaked || echo closed')")
    assert run.stdout == "closed\n"


def test_output_is_utf8_with_undecodable_text_escaped(python_kernel):
    run = python_kernel.execute("print('héllo ✓'); print('\\udcff')")
    assert run.stdout == "héllo ✓\n\\udcff\n"


def test_lone_surrogates_cannot_break_a_frame(python_kernel):
    # The harness parses frames as strictly as the host does.
    run = python_kernel.execute("display({'text/plain': 'a\\ud800b', 'application/json': ['\\udc00']}, raw=True)")
    assert run.results[0]["data"] == {"text/plain": "a?b", "application/json": ["?"]}


RICH_CLASS = textwrap.dedent(
    """\
    import base64
    PNG = base64.b64decode(
        'iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNk+M9QDwADhgGAWjR9awAAAABJRU5ErkJggg==')
    class Rich:
        def __repr__(self): return 'Rich()'
        def _repr_html_(self): return '<b>rich</b>'
        def _repr_markdown_(self): return '**rich**'
        def _repr_svg_(self): return '<svg xmlns="http://www.w3.org/2000/svg"/>'
        def _repr_png_(self): return PNG
        def _repr_json_(self): return {'rich': [1, 2.5, None, True]}
    """
)


def test_every_mime_type_round_trips_as_the_main_result(python_kernel):
    assert python_kernel.execute(RICH_CLASS).status == "ok"
    data = python_kernel.execute("Rich()").main_result
    assert data["text/plain"] == "Rich()"
    assert data["text/html"] == "<b>rich</b>"
    assert data["text/markdown"] == "**rich**"
    assert data["image/svg+xml"] == '<svg xmlns="http://www.w3.org/2000/svg"/>'
    assert is_png(data["image/png"]) and "\n" not in data["image/png"]
    assert data["application/json"] == {"rich": [1, 2.5, None, True]}


def test_display_calls_are_results_in_order_before_the_main_result(python_kernel):
    python_kernel.execute(RICH_CLASS)
    run = python_kernel.execute("display('one')\ndisplay(Rich())\n'last'")
    kinds = [(r["is_main_result"], r["data"]["text/plain"]) for r in run.results]
    assert kinds == [(False, "'one'"), (False, "Rich()"), (True, "'last'")]
    assert run.results[1]["data"]["text/html"] == "<b>rich</b>"


def test_none_and_a_trailing_semicolon_give_no_result(python_kernel):
    assert python_kernel.execute("None").results == []
    assert python_kernel.execute("print('x')").results == []
    assert python_kernel.execute("1 + 1;").results == []


def test_pandas_then_describe_then_a_plot(python_kernel):
    run = python_kernel.execute("import pandas as pd\ndf = pd.DataFrame({'a': [1, 2, 3], 'b': [4.0, 5.5, 6.0]})")
    assert run.status == "ok" and run.results == []
    described = python_kernel.execute("df.describe()").main_result
    assert "<table" in described["text/html"] and "mean" in described["text/plain"]
    plotted = python_kernel.execute("import matplotlib.pyplot as plt\ndf.plot(x='a', y='b')\nplt.show()")
    assert plotted.status == "ok", plotted.errors
    pngs = [r for r in plotted.results if "image/png" in r["data"]]
    assert len(pngs) == 1 and not pngs[0]["is_main_result"]
    assert is_png(pngs[0]["data"]["image/png"])


def test_plt_show_emits_figures_where_it_is_called_and_closes_them(python_kernel):
    code = textwrap.dedent(
        """\
        import matplotlib.pyplot as plt
        display('before')
        plt.plot([1, 2, 3])
        plt.show()
        display('after')
        """
    )
    run = python_kernel.execute(code)
    order = ["png" if "image/png" in r["data"] else r["data"]["text/plain"] for r in run.results]
    assert order == ["'before'", "png", "'after'"]
    assert python_kernel.execute("plt.get_fignums()").main_result == {"text/plain": "[]"}


def test_figures_left_open_are_emitted_at_the_end_and_closed(python_kernel):
    code = "import matplotlib.pyplot as plt\nfig, ax = plt.subplots()\nax.bar(['a', 'b'], [3, 5])\nplt.figure()\nplt.plot([0, 1]);"
    run = python_kernel.execute(code)
    pngs = [r["data"]["image/png"] for r in run.results if "image/png" in r["data"]]
    assert len(pngs) == 2 and all(is_png(p) for p in pngs)
    assert all(not r["is_main_result"] for r in run.results)
    assert python_kernel.execute("len(plt.get_fignums())").main_result == {"text/plain": "0"}


def test_an_exception_gives_name_value_and_a_clean_traceback(python_kernel):
    run = python_kernel.execute("def inner():\n    return 1 / 0\n\ninner()")
    assert run.status == "error"
    [error] = run.errors
    assert error["name"] == "ZeroDivisionError"
    assert error["value"] == "division by zero"
    traceback = error["traceback"]
    assert re.search(r"Cell In ?\[\d+\], line 2, in inner", traceback)  # IPython 8.5 has the space
    assert "return 1 / 0" in traceback and "inner()" in traceback
    assert traceback.rstrip().endswith("ZeroDivisionError: division by zero")
    for internal in ("corral_kernel", "interactiveshell.py", "IPython", ANSI_ESCAPE):
        assert internal not in traceback, internal


def test_a_syntax_error_is_reported(python_kernel):
    run = python_kernel.execute("x = (1,\ny = 2")
    assert run.status == "error"
    [error] = run.errors
    assert error["name"] == "SyntaxError"
    assert "never closed" in error["value"] or "invalid syntax" in error["value"]
    assert "x = (1," in error["traceback"] and ANSI_ESCAPE not in error["traceback"]


def test_an_unknown_magic_is_a_usage_error(python_kernel):
    run = python_kernel.execute("%no_such_magic")
    assert run.status == "error"
    assert run.errors[0]["name"] == "UsageError"


def test_magics_and_shell_escapes_work(python_kernel):
    timed = python_kernel.execute("%timeit -n 1 -r 1 sum(range(10))")
    assert timed.status == "ok" and "per loop" in timed.stdout
    listed = python_kernel.execute(f"!ls {RUNTIME}")
    assert "corral_kernel.py" in listed.stdout


def test_an_unknown_frame_is_logged_and_ignored(python_kernel):
    python_kernel.send({"type": "no_such_frame", "id": "x"})
    python_kernel.sock.sendall(b"\0\0\0\x05[1,2]")  # JSON, but not an object
    run = python_kernel.execute("'still here'")
    assert run.main_result == {"text/plain": "'still here'"}
    assert "unknown type 'no_such_frame'" in python_kernel.stderr_text()


def test_a_60_mib_frame_is_accepted(python_kernel):
    run = python_kernel.execute("big = '" + "a" * (60 << 20) + "'\nlen(big)", timeout=120)
    assert run.main_result == {"text/plain": str(60 << 20)}
    python_kernel.execute("del big")


def test_a_result_over_32_mib_becomes_an_error(python_kernel):
    code = textwrap.dedent(
        """\
        class Huge:
            def _repr_png_(self): return b'\\x89PNG\\r\\n\\x1a\\n' + bytes(33 << 20)
        Huge()
        """
    )
    run = python_kernel.execute(code, timeout=120)
    assert run.status == "error"
    assert run.results == []
    [error] = run.errors
    assert error["name"] == "ResultTooLarge" and "exceeds the limit" in error["value"]
    assert python_kernel.execute("1").main_result == {"text/plain": "1"}


def test_sigint_interrupts_the_cell_and_keeps_state(fresh_kernel):
    kernel = fresh_kernel(PYTHON_KERNEL)
    assert kernel.execute("x = 1").status == "ok"
    run = kernel.execute("import time\ntime.sleep(30)", interrupt_after=1)
    assert run.done_at - run.started < 5
    assert run.status == "error"
    [error] = run.errors
    assert error["name"] == "KeyboardInterrupt"
    assert "time.sleep(30)" in error["traceback"] and "corral_kernel" not in error["traceback"]
    assert kernel.execute("x").main_result == {"text/plain": "1"}
    kernel.interrupt()  # while idle: ignored
    assert kernel.execute("x + 1").main_result == {"text/plain": "2"}


def test_exit_ends_the_kernel_after_done(fresh_kernel):
    kernel = fresh_kernel(PYTHON_KERNEL)
    run = kernel.execute("print('bye')\nexit()")
    assert (run.status, run.stdout) == ("ok", "bye\n")
    assert kernel.proc.wait(timeout=10) == 0


def test_end_of_file_on_fd_3_exits_zero(fresh_kernel):
    kernel = fresh_kernel(PYTHON_KERNEL)
    assert kernel.execute("1").status == "ok"
    assert kernel.close() == 0


def test_a_read_only_home_is_fine(fresh_kernel, tmp_path):
    not_a_directory = tmp_path / "home"
    not_a_directory.write_text("")  # mkdir under it fails, even for root
    env = kernel_env(HOME=str(not_a_directory), MPLCONFIGDIR=str(tmp_path / "mpl"))
    kernel = fresh_kernel(PYTHON_KERNEL, env=env)
    assert kernel.execute("2 * 21").main_result == {"text/plain": "42"}
    assert kernel.execute("import os; os.environ['IPYTHONDIR']").main_result == {"text/plain": "'/tmp/corral-ipython'"}


ZYGOTE = f"""
import os, sys
sys.path.insert(0, {str(RUNTIME)!r})
import corral_kernel
corral_kernel.prepare()
children = []
for fd in (3, 4):
    pid = os.fork()
    if pid == 0:
        os.dup2(fd, 3)
        os.closerange(4, 256)
        corral_kernel.reseed()
        corral_kernel.serve(3)
        os._exit(0)
    children.append(pid)
os.closerange(3, 5)
for pid in children:
    os.waitpid(pid, 0)
"""


def test_sessions_forked_from_a_prepared_zygote_work_and_differ():
    zygote = Kernel([PYTHON, "-c", ZYGOTE], extra_sockets=1)
    try:
        first, second = zygote.sockets
        for sock in (first, second):
            assert zygote.wait_ready(sock)["language"] == "python"
        draw = "import random, numpy\n[random.random(), float(numpy.random.rand())]"
        one, two = (json.loads(zygote.execute(draw, sock=s).main_result["text/plain"]) for s in (first, second))
        assert one[0] != two[0] and one[1] != two[1], "forked sessions share a random stream"
        assert zygote.execute("secret = 7", sock=first).status == "ok"
        assert zygote.execute("secret", sock=second).errors[0]["name"] == "NameError"
        plot = zygote.execute("import matplotlib.pyplot as plt\nplt.plot([1, 3, 2]);", sock=second)
        assert is_png(plot.results[0]["data"]["image/png"])
        assert zygote.close() == 0
    finally:
        zygote.kill()


def test_prepare_is_idempotent_and_importing_has_no_side_effects():
    check = f"""
import sys
sys.path.insert(0, {str(RUNTIME)!r})
import corral_kernel, corral_kernel_lib
assert 'IPython' not in sys.modules and 'numpy' not in sys.modules
shell = corral_kernel.prepare()
assert corral_kernel.prepare() is shell
assert 'numpy' in sys.modules and 'pandas' in sys.modules and 'matplotlib.pyplot' in sys.modules
import threading
assert threading.active_count() == 1, threading.enumerate()  # a fork keeps only one
print('ok')
"""
    kernel = Kernel([PYTHON, "-c", check])
    try:
        assert kernel.wait_exit() == 0, kernel.stderr_text()
        assert kernel.stdout_text() == "ok\n"
    finally:
        kernel.kill()


def test_without_prepare_unprepare_does_nothing_and_reseed_imports_nothing():
    """The lean zygote's children (one-shot runs) call both without prepare() having run."""
    check = f"""
import os, sys
sys.path.insert(0, {str(RUNTIME)!r})
import corral_kernel_lib
path, environ = list(sys.path), dict(os.environ)
corral_kernel_lib.unprepare()
corral_kernel_lib.reseed()
assert (sys.path, dict(os.environ)) == (path, environ)
assert 'random' not in sys.modules and 'numpy' not in sys.modules
import random
state = random.getstate()
corral_kernel_lib.reseed()
assert random.getstate() != state
print('ok')
"""
    kernel = Kernel([PYTHON, "-c", check])
    try:
        assert kernel.wait_exit() == 0, kernel.stderr_text()
        assert kernel.stdout_text() == "ok\n"
    finally:
        kernel.kill()
