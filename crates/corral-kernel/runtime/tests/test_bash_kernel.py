"""The bash session kernel (python3 corral_bash.py driving one persistent bash)."""

import os
import signal
import time

from harness import BASH_KERNEL


def is_gone(pid):
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().rsplit(")", 1)[1].split()[0] == "Z"  # a zombie is dead
    except FileNotFoundError:
        return True


def exit_code_error(run):
    [error] = run.errors
    assert (error["name"], error["traceback"]) == ("ExitCode", "")
    return int(error["value"])


def test_ready_names_bash_and_its_version(bash_kernel):
    assert bash_kernel.ready["language"] == "bash"
    assert bash_kernel.ready["version"][0].isdigit()


def test_cd_variables_functions_and_aliases_persist(bash_kernel, tmp_path):
    run = bash_kernel.execute(f"cd {tmp_path}\nname=corral\ngreet() {{ echo hello $1; }}\nalias shout='echo LOUD'")
    assert run.status == "ok" and run.errors == [] and run.results == []
    assert bash_kernel.execute("pwd; greet $name; shout").stdout == f"{tmp_path}\nhello corral\nLOUD\n"


def test_output_goes_straight_to_stdout_and_stderr(bash_kernel):
    run = bash_kernel.execute("echo out; echo err >&2; printf 'no newline'")
    assert (run.stdout, run.stderr) == ("out\nno newline", "err\n")


def test_output_streams_while_the_command_runs(bash_kernel):
    run = bash_kernel.execute("echo first; sleep 1; echo second")
    first_at = next(at for at, chunk in run.stdout_chunks if b"first" in chunk)
    assert run.done_at - first_at > 0.8


def test_a_failing_command_is_an_exit_code_error(bash_kernel):
    run = bash_kernel.execute("echo before; (exit 7)")
    assert run.status == "error" and exit_code_error(run) == 7 and run.stdout == "before\n"
    assert bash_kernel.execute("echo status was $?").stdout == "status was 7\n"


def test_a_syntax_error_is_an_error(bash_kernel):
    run = bash_kernel.execute("if then fi")
    assert run.status == "error" and exit_code_error(run) == 2
    assert "syntax error" in run.stderr
    assert bash_kernel.execute("echo fine").stdout == "fine\n"


def test_any_text_reaches_bash_unchanged(bash_kernel):
    code = "cat <<'EOF'\nsingle ' double \" back \\ dollar $HOME bang ! tab\t é ✓\nEOF"
    assert bash_kernel.execute(code).stdout == "single ' double \" back \\ dollar $HOME bang ! tab\t é ✓\n"
    assert bash_kernel.execute("echo $'a\\tb' \"${undefined:-default}\"").stdout == "a\tb default\n"


def test_commands_read_dev_null_not_the_kernel_pipe(bash_kernel):
    run = bash_kernel.execute("cat; read line || echo read-eof")
    assert run.status == "ok" and run.stdout == "read-eof\n"


def test_sigint_interrupts_the_command_and_the_shell_survives(fresh_kernel):
    kernel = fresh_kernel(BASH_KERNEL)
    kernel.execute("kept=yes; cd /tmp")
    run = kernel.execute("sleep 30; echo not reached", interrupt_after=1)
    assert run.done_at - run.started < 5
    assert run.status == "error" and exit_code_error(run) == 130
    assert "not reached" not in run.stdout
    assert kernel.execute("echo $kept $PWD").stdout == "yes /tmp\n"
    kernel.interrupt()  # while idle: ignored
    assert kernel.execute("echo still").stdout == "still\n"


def test_a_stray_prompt_after_an_interrupt_is_skipped(fresh_kernel):
    # An interrupt that reaches bash just after a cell ended makes it prompt (and report a
    # status) once more; the next cell must not take that status for its own.
    kernel = fresh_kernel(BASH_KERNEL)
    kernel.execute("kept=1")
    with open(f"/proc/{kernel.proc.pid}/task/{kernel.proc.pid}/children") as children:
        bash_pid = int(children.read().split()[0])
    os.killpg(bash_pid, signal.SIGINT)
    time.sleep(0.3)
    run = kernel.execute("echo $kept")
    assert (run.status, run.stdout) == ("ok", "1\n")
    assert exit_code_error(kernel.execute("false")) == 1


def test_exit_ends_the_kernel_with_its_status(fresh_kernel):
    kernel = fresh_kernel(BASH_KERNEL)
    run = kernel.execute("exit 3")
    assert run.status == "error"
    [error] = run.errors
    assert (error["name"], error["value"], error["traceback"]) == ("ExitCode", "3", "bash exited")
    assert kernel.proc.wait(timeout=10) == 3


def test_end_of_file_on_fd_3_exits_zero_and_kills_background_jobs(fresh_kernel):
    kernel = fresh_kernel(BASH_KERNEL)
    job = int(kernel.execute("sleep 300 & echo $!").stdout)
    assert kernel.close() == 0
    deadline = time.monotonic() + 5
    while not is_gone(job):
        assert time.monotonic() < deadline, "the background job outlived the kernel"
        time.sleep(0.05)
