"""`command` frames: a program run beside the interpreter, in every session kernel."""

import os
import signal
import time

import pytest

from harness import BASH_KERNEL, JS_KERNEL, PYTHON_KERNEL

KERNELS = {"python": PYTHON_KERNEL, "bash": BASH_KERNEL, "javascript": JS_KERNEL}
FIXTURES = {"python": "python_kernel", "bash": "bash_kernel", "javascript": "js_kernel"}


@pytest.fixture(params=list(KERNELS))
def kernel(request):
    """Each language's module-wide kernel."""
    return request.getfixturevalue(FIXTURES[request.param])


@pytest.fixture(params=list(KERNELS))
def own_kernel(request, fresh_kernel):
    """A kernel of each language for one test."""
    return fresh_kernel(KERNELS[request.param])


def failure(run):
    """(name, value) of the command's error frame; checks that `done` says error."""
    [error] = run.errors
    assert run.status == "error" and error["traceback"] == "", run.messages
    return error["name"], error["value"]


def is_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead
    except FileNotFoundError:
        return True


def test_output_streams_to_stdout_and_stderr(kernel, tmp_path):
    run = kernel.command(["sh", "-c", "echo first; echo err >&2; sleep 1; echo second"], cwd=str(tmp_path))
    assert run.messages == [{"type": "done", "id": run.id, "status": "ok"}]
    assert (run.stdout, run.stderr) == ("first\nsecond\n", "err\n")
    first_at = next(at for at, chunk in run.stdout_chunks if b"first" in chunk)
    assert run.done_at - first_at > 0.8, "the first line waited for the end of the command"


def test_a_non_zero_exit_is_an_exit_code_error(kernel, tmp_path):
    run = kernel.command(["sh", "-c", "echo before; exit 7"], cwd=str(tmp_path))
    assert failure(run) == ("ExitCode", "7") and run.stdout == "before\n"


def test_death_by_a_signal_is_128_plus_the_signal(kernel, tmp_path):
    run = kernel.command(["sh", "-c", "kill -TERM $$"], cwd=str(tmp_path))
    assert failure(run) == ("ExitCode", "143")


def test_a_missing_program_or_directory_is_a_command_error(kernel, tmp_path):
    run = kernel.command(["corral-no-such-program", "x"], cwd=str(tmp_path))
    assert failure(run) == ("CommandError", "No such file or directory: 'corral-no-such-program'")
    missing = str(tmp_path / "missing")
    run = kernel.command(["pwd"], cwd=missing)
    assert failure(run) == ("CommandError", f"No such file or directory: '{missing}'")
    assert kernel.command(["true"], cwd=str(tmp_path)).status == "ok"


def test_cwd_env_and_stdin(kernel, tmp_path):
    (tmp_path / "sub").mkdir()
    script = 'pwd; echo "$GREETING $LANG"; cat; test -S /proc/self/fd/3 && echo socket-leaked; true'
    run = kernel.command(["sh", "-c", script], cwd=str(tmp_path / "sub"), env={"GREETING": "hi", "LANG": "C"})
    assert run.status == "ok", run.messages
    # The kernel's environment plus (over) the frame's; stdin is /dev/null; no socket at fd 3.
    assert run.stdout == f"{tmp_path / 'sub'}\nhi C\n"
    assert kernel.command(["sh", "-c", 'echo "$PATH"'], cwd=str(tmp_path)).stdout == "/usr/local/bin:/usr/bin:/bin\n"


def test_arguments_reach_the_program_unchanged(kernel, tmp_path):
    args = ["a b", "", "'\"$HOME\\", "é ✓", "*"]
    run = kernel.command(["printf", "[%s]\\n", *args], cwd=str(tmp_path))
    assert run.stdout == "".join(f"[{a}]\n" for a in args)


def test_a_malformed_command_frame_is_logged_and_ignored(kernel, tmp_path):
    for bad in ({"argv": []}, {"argv": ["true", 1]}, {"argv": ["true"], "env": {"A": 1}}, {"argv": "true"}):
        kernel.send({"type": "command", "id": "bad", **bad})
    assert kernel.command(["echo", "fine"], cwd=str(tmp_path)).stdout == "fine\n"
    assert kernel.stderr_text().count("ignoring a command frame") >= 4


def test_sigint_kills_the_process_group_and_the_kernel_survives(own_kernel, tmp_path):
    started = time.monotonic()
    # The group: sh, a background sleep and a foreground one (sh ignores SIGINT for `&`).
    run = own_kernel.command(["sh", "-c", "sleep 300 & echo $!; sleep 300"], cwd=str(tmp_path), interrupt_after=1)
    assert time.monotonic() - started < 5
    assert failure(run) == ("ExitCode", "130")
    background = int(run.stdout)
    deadline = time.monotonic() + 5
    while not is_gone(background):
        assert time.monotonic() < deadline, "the background job outlived the interrupt"
        time.sleep(0.05)
    own_kernel.interrupt()  # while idle: ignored
    time.sleep(0.2)  # once it has arrived (Node may handle a signal a moment later)
    assert own_kernel.command(["echo", "alive"], cwd=str(tmp_path)).stdout == "alive\n"


def test_background_processes_are_not_waited_for(kernel, tmp_path):
    run = kernel.command(["sh", "-c", "sleep 300 >/dev/null 2>&1 & echo $!"], cwd=str(tmp_path), timeout=5)
    assert run.status == "ok"
    os.kill(int(run.stdout), signal.SIGKILL)


def test_commands_run_in_their_own_session(kernel, tmp_path):
    run = kernel.command(["sh", "-c", "echo $$; ps -o sid= -p $$"], cwd=str(tmp_path))
    pid, sid = run.stdout.split()
    assert pid == sid and int(sid) != os.getsid(0)


# -- the interpreter's state is untouched ------------------------------------------------


def test_python_state_count_and_underscore_are_untouched(python_kernel, tmp_path):
    python_kernel.execute("import os\nx = 1\nbefore = get_ipython().execution_count\nbefore_dir = os.getcwd()")
    python_kernel.execute("41")
    assert python_kernel.command(["sh", "-c", "exit 3"], cwd=str(tmp_path)).status == "error"
    assert python_kernel.command(["true"], cwd=str(tmp_path)).status == "ok"
    run = python_kernel.execute("(x, _ + 1, get_ipython().execution_count - before, os.getcwd() == before_dir)")
    assert run.main_result["text/plain"] == "(1, 42, 2, True)"


def test_bash_state_and_status_are_untouched(bash_kernel, tmp_path):
    bash_kernel.execute(f"kept=yes; cd {tmp_path}; (exit 4)")
    assert bash_kernel.command(["sh", "-c", "cd /; exit 9"], cwd="/").status == "error"
    assert bash_kernel.execute("echo $? $kept $PWD").stdout == f"4 yes {tmp_path}\n"


def test_javascript_state_and_cell_numbers_are_untouched(js_kernel, tmp_path):
    first = js_kernel.execute("let kept = 1; throw new Error('x')").errors[0]["traceback"]
    cell = int(first.split("In[", 1)[1].split("]", 1)[0])
    assert js_kernel.command(["true"], cwd=str(tmp_path)).status == "ok"
    second = js_kernel.execute("kept += 1; throw new Error(String(kept))").errors[0]
    assert second["value"] == "2" and f"In[{cell + 1}]" in second["traceback"]
