"""Corral's bash kernel; it runs inside the sandbox (docs/kernel-protocol.md).

Start: ``python3 corral_bash.py``, with the host's socket at fd 3. Bash speaks no JSON, so
this wrapper holds the protocol and drives one persistent bash, in which ``cd``,
variables, functions and aliases survive between executions.

The bash is interactive (``-i``) because only an interactive shell, on SIGINT, abandons
the command line it runs and goes on reading the next one: a script would die or carry on
with the next command. It reads cells on a pipe (its stdin); its stdout and stderr are
the kernel's fd 1 and 2, inherited, so output is never relayed. It reports on a private
status pipe: a marker when it starts a cell (it has then read the whole line, so an
interrupt can no longer cut the cell's text in two) and, from PROMPT_COMMAND, the exit
status once the cell's line is finished.

A `command` frame runs its program beside bash, as a child of this wrapper: bash and its
state never see it.
"""

import json
import os
import signal
import subprocess
import sys

# Beside this file in /run/corral: the frames and `command` frames as the Python kernel has them.
import corral_kernel_lib as lib

STARTED = "started"  # the status pipe's line when a cell begins


class Bash:
    """One interactive bash and the pipes that drive it."""

    def __init__(self):
        status_read, status_write = os.pipe()
        # The real stderr goes in through another fd: bash's own start-up chatter (no job
        # control without a terminal, the first prompt) is sent to /dev/null.
        stderr_copy = os.dup(2)
        env = {k: v for k, v in os.environ.items() if k != "PROMPT_COMMAND"}
        self.process = subprocess.Popen(
            ["bash", "--noprofile", "--norc", "--noediting", "-i"],
            stdin=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
            pass_fds=(status_write, stderr_copy),
            process_group=0,  # SIGINT goes to bash and its children, never to us
            env=env,
        )
        os.close(status_write)
        os.close(stderr_copy)
        self.status_fd = status_write  # its number inside bash
        self.status_pipe = os.fdopen(status_read, "rb", buffering=0)
        self.pending = b""
        # What SIGINT does: nothing while "idle"; while bash is "reading" a cell it waits
        # (a prompt-level interrupt would drop the rest of the line, whose text bash would
        # then run as commands); while bash is "running" it goes to bash's process group.
        self.state = "idle"
        self.interrupt_deferred = False
        fd = self.status_fd
        self.send_line(
            f"exec 2>&{stderr_copy} {stderr_copy}>&-; PS1= PS2= PS0=; set +o history +H; "
            f"declare -r PROMPT_COMMAND='builtin printf \"%d\\n\" $? >&{fd}'; "
            "__corral_return() { return $1; }; "
            f"builtin printf '%s\\n' \"$BASH_VERSION\" >&{fd}"
        )
        self.version = self.read_status_line().decode()
        self.read_status_line()  # the setup line's own status

    def send_line(self, line):
        self.process.stdin.write(line.encode("utf-8", "replace") + b"\n")
        self.process.stdin.flush()

    def read_status_line(self):
        """The next line on the status pipe, or None once bash has exited."""
        while b"\n" not in self.pending:
            chunk = self.status_pipe.read(4096)
            if not chunk:
                return None
            self.pending += chunk
        line, self.pending = self.pending.split(b"\n", 1)
        return line

    def on_sigint(self, signum, frame):
        if self.state == "running":
            os.killpg(self.process.pid, signal.SIGINT)
        elif self.state == "reading":
            self.interrupt_deferred = True

    def run(self, code):
        """Runs `code`; returns its exit status, or None if bash exited."""
        # $'...' keeps every byte but NUL (which bash cannot hold); the status of the
        # previous cell is restored first so that `$?` means what the user expects.
        quoted = code.replace("\0", "").replace("\\", "\\\\").replace("'", "\\'")
        fd = self.status_fd
        self.state, self.interrupt_deferred = "reading", False
        try:
            self.send_line(
                f"__corral_status=$?; builtin printf '{STARTED}\\n' >&{fd}; "
                f"__corral_return $__corral_status; builtin eval $'{quoted}' </dev/null {fd}>&-"
            )
            # Skip statuses of stray prompts (an interrupt that came as bash finished the
            # previous cell makes it prompt, and report, once more).
            while (line := self.read_status_line()) != STARTED.encode():
                if line is None:
                    return None
            self.state = "running"
            if self.interrupt_deferred:
                os.killpg(self.process.pid, signal.SIGINT)
            status = self.read_status_line()
        except BrokenPipeError:
            return None
        finally:
            self.state = "idle"
        return None if status is None else int(status)

    def kill(self):
        try:
            os.killpg(self.process.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.process.wait()


def read_frame(fd):
    """The next `execute` or `command` frame; None when the host hangs up. Other frames are
    logged and skipped."""
    while True:
        header = lib.read_exactly(fd, 4)
        if header is None:
            return None
        size = int.from_bytes(header, "big")
        if size > lib.MAX_FRAME:
            lib.log(f"the host sent a frame of {size} bytes")
            sys.exit(2)
        payload = lib.read_exactly(fd, size)
        if payload is None:
            return None
        try:
            message = json.loads(payload)
        except ValueError as error:
            lib.log(f"ignoring a frame that is not JSON: {error}")
            continue
        kind = message.get("type") if isinstance(message, dict) else type(message).__name__
        if kind == "execute":
            if isinstance(message.get("id"), str) and isinstance(message.get("code"), str):
                return message
            lib.log("ignoring an execute frame without a string id and code")
        elif kind == "command":
            if lib.is_command(message):
                return message
            lib.log("ignoring a command frame without a string id, argv, cwd and env")
        else:
            lib.log(f"ignoring a frame of unknown type {kind!r}")


def main(sock_fd=3):
    bash = Bash()
    signal.signal(signal.SIGINT, bash.on_sigint)
    lib.send_message(sock_fd, {"type": "ready", "language": "bash", "version": bash.version})
    try:
        while (message := read_frame(sock_fd)) is not None:
            exec_id = message["id"]
            if message["type"] == "command":
                failure = lib.run_command(message["argv"], message.get("cwd"), message.get("env"))
                if failure is not None:
                    name, value = failure
                    lib.send_message(sock_fd, {"type": "error", "id": exec_id, "name": name, "value": value, "traceback": ""})
                lib.send_message(sock_fd, {"type": "done", "id": exec_id, "status": "ok" if failure is None else "error"})
                continue
            status = bash.run(message["code"])
            exited = status is None
            if exited:
                status = bash.process.wait()
            if status != 0:
                error = {"type": "error", "id": exec_id, "name": "ExitCode", "value": str(status)}
                lib.send_message(sock_fd, {**error, "traceback": "bash exited" if exited else ""})
            lib.send_message(sock_fd, {"type": "done", "id": exec_id, "status": "ok" if status == 0 else "error"})
            if exited:
                return status
    except BrokenPipeError:
        pass  # the host went away: same as end of file
    finally:
        bash.kill()
    return 0


if __name__ == "__main__":
    sys.exit(main())
