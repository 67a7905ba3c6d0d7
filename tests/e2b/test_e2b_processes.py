"""Processes and PTYs with the unmodified E2B SDK (issue 22): commands that run beside
run_code and each other, listed, connected to, fed stdin, signalled; a real terminal that
takes input, resizes and is killed. Every call served by the sandbox's process agent."""

import threading
import time

import pytest

from e2b import CommandExitException, PtySize, RateLimitException
from e2b_code_interpreter import Sandbox


@pytest.fixture(scope="module")
def sandbox():
    sbx = Sandbox.create()
    yield sbx
    sbx.kill()


def test_commands_run_while_code_runs(sandbox):
    done = {}

    def cell():
        done["cell"] = sandbox.run_code("import time; time.sleep(3); 'cell'")

    thread = threading.Thread(target=cell)
    thread.start()
    time.sleep(0.5)
    started = time.monotonic()
    result = sandbox.commands.run("echo beside; id -u; pwd")
    took = time.monotonic() - started
    thread.join()
    assert result.stdout == "beside\n1000\n/workspace\n"
    assert took < 2.0, f"the command waited for the cell ({took:.1f}s)"
    assert done["cell"].text == "cell"


def test_background_commands_are_listed_connected_and_killed(sandbox):
    handle = sandbox.commands.run(
        "for i in $(seq 1 600); do echo tick$i; sleep 0.1; done",
        background=True,
        envs={"CORRAL_E2B": "yes"},
        cwd="/home/user",
    )
    listed = {p.pid: p for p in sandbox.commands.list()}
    assert handle.pid in listed
    info = listed[handle.pid]
    assert info.cmd == "/bin/bash"
    assert info.args[-1].startswith("for i in")
    assert info.envs.get("CORRAL_E2B") == "yes"

    # Leave the stream, then connect again: output goes on from now.
    for stdout, _, _ in handle:
        if stdout and "tick3" in stdout:
            break
    handle.disconnect()
    again = sandbox.commands.connect(handle.pid)
    seen = []
    for stdout, _, _ in again:
        if stdout:
            seen.append(stdout)
        if len("".join(seen).splitlines()) >= 3:
            break
    assert "tick" in "".join(seen)
    assert not "".join(seen).startswith("tick1\n")

    assert sandbox.commands.kill(handle.pid) is True
    with pytest.raises(CommandExitException) as excinfo:
        again.wait()
    assert excinfo.value.error == "signal: killed"
    assert handle.pid not in {p.pid for p in sandbox.commands.list()}
    assert sandbox.commands.kill(handle.pid) is False


def test_stdin_is_sent_and_closed(sandbox):
    handle = sandbox.commands.run("cat; echo EOF", background=True, stdin=True)
    sandbox.commands.send_stdin(handle.pid, "hello ")
    handle.send_stdin("world\n")
    handle.close_stdin()
    result = handle.wait()
    assert result.stdout == "hello world\nEOF\n"
    assert result.exit_code == 0


def test_stdin_is_streamed_in_order(sandbox):
    handle = sandbox.commands.run("cat", background=True, stdin=True)
    sandbox.commands.stream_input(handle.pid, ["one ", b"two ", "three"])
    handle.close_stdin()
    assert handle.wait().stdout == "one two three"


def test_a_pty_takes_input_resizes_and_is_killed(sandbox):
    output = bytearray()
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80), envs={"PS1": "$ "})

    def wait_for(needle, output=output, timeout=10):
        deadline = time.monotonic() + timeout
        while needle not in output.decode(errors="replace"):
            assert time.monotonic() < deadline, f"{needle!r} not in {bytes(output)!r}"
            time.sleep(0.05)

    reader = threading.Thread(target=lambda: _read_terminal(terminal, output))
    reader.start()
    sandbox.pty.send_stdin(terminal.pid, b"tty; stty size\n")
    wait_for("24 80")
    assert "/dev/pts/" in output.decode(errors="replace")
    sandbox.pty.resize(terminal.pid, PtySize(rows=40, cols=100))
    sandbox.pty.send_stdin(terminal.pid, b"stty size\n")
    wait_for("40 100")

    # A second stream of the same terminal (the sync handle cannot be left from another
    # thread while one reads it): output from now on, to both.
    again_output = bytearray()
    again = sandbox.pty.connect(terminal.pid)
    second = threading.Thread(target=lambda: _read_terminal(again, again_output))
    second.start()
    sandbox.pty.send_stdin(terminal.pid, b"echo $((6 * 7))\n")
    wait_for("42", again_output)
    assert b"24 80" not in again_output  # no replay from the start

    assert sandbox.pty.kill(terminal.pid) is True
    for thread in (reader, second):
        thread.join(timeout=10)
        assert not thread.is_alive()
    assert sandbox.pty.kill(terminal.pid) is False


def _read_terminal(handle, output):
    try:
        for _, _, pty in handle:
            if pty:
                output.extend(pty)
    except CommandExitException:
        pass


def test_a_flooded_pty_refuses_input_and_the_sandbox_goes_on(sandbox):
    # A terminal in raw mode whose program never reads (in canonical mode the terminal itself
    # drops what does not fit its line): the agent holds at most 64 KiB of its input and
    # refuses the rest with a clear error; the sandbox and its other calls are unaffected.
    terminal = sandbox.pty.create(PtySize(rows=24, cols=80))
    sandbox.pty.send_stdin(terminal.pid, b"stty raw -echo; exec sleep 600\n")
    time.sleep(0.5)
    refused = None
    for _ in range(200):
        try:
            sandbox.pty.send_stdin(terminal.pid, b"x" * 16384)
        except Exception as e:  # noqa: BLE001 - the SDK's exception type is what is checked
            refused = e
            break
    assert refused is not None, "16 KiB x 200 accepted by a program that never reads"
    assert "full" in str(refused), repr(refused)
    assert sandbox.commands.run("echo still").stdout == "still\n"
    assert sandbox.run_code("1 + 1").text == "2"
    assert sandbox.pty.kill(terminal.pid) is True


def test_processes_of_another_sandbox_are_out_of_reach(sandbox):
    other = Sandbox.create()
    try:
        handle = other.commands.run("sleep 60", background=True)
        assert handle.pid not in {p.pid for p in sandbox.commands.list()}
        assert sandbox.commands.kill(handle.pid) is False
        assert handle.pid in {p.pid for p in other.commands.list()}
        assert handle.kill() is True
    finally:
        other.kill()


def test_commands_and_their_streams_are_bounded():
    # A sandbox of its own: the bounds are per sandbox. At most 32 commands at once, and 4
    # streams of one command; what is refused says so, and the sandbox goes on.
    sbx = Sandbox.create()
    try:
        handles = [sbx.commands.run("sleep 120", background=True) for _ in range(32)]
        # resource_exhausted, which the SDK reads as RateLimitException.
        with pytest.raises(RateLimitException, match="32 processes"):
            sbx.commands.run("echo one too many")
        streams = [sbx.commands.connect(handles[0].pid) for _ in range(3)]  # with its own: 4
        with pytest.raises(RateLimitException) as excinfo:
            sbx.commands.connect(handles[0].pid)
        assert "4 output streams" in str(excinfo.value), repr(excinfo.value)
        for stream in streams:
            stream.disconnect()
        for handle in handles:
            assert handle.kill() is True
        assert sbx.commands.run("echo room again").stdout == "room again\n"
    finally:
        sbx.kill()
