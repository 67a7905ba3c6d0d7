"""Runs a kernel as a subprocess outside any sandbox and speaks the frame protocol to it
the way the host does: fd 3 is one end of a socketpair, stdout and stderr are pipes read
concurrently with the frames, stdin is /dev/null."""

import base64
import fcntl
import json
import os
import selectors
import signal
import socket
import subprocess
import time
from pathlib import Path

RUNTIME = Path(__file__).resolve().parent.parent
PYTHON = os.environ.get("CORRAL_TEST_PYTHON", "/usr/bin/python3")
NODE = os.environ.get("CORRAL_TEST_NODE", "node")

PYTHON_KERNEL = [PYTHON, str(RUNTIME / "corral_kernel.py")]
JS_KERNEL = [NODE, "--expose-internals", str(RUNTIME / "corral_kernel.js")]
BASH_KERNEL = [PYTHON, str(RUNTIME / "corral_bash.py")]


def kernel_env(**extra):
    """The small fixed environment a sandbox gives its kernel."""
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "LANG": "C.UTF-8",
        "HOME": os.environ.get("HOME", "/root"),
        "MPLBACKEND": "Agg",
    }
    env.update(extra)
    return {k: v for k, v in env.items() if v is not None}


def is_png(text):
    """True when `text` is base64 (without newlines) of a PNG file."""
    return base64.b64decode(text, validate=True).startswith(b"\x89PNG\r\n\x1a\n")


def decode_strictly(payload):
    """The frame's JSON object, checked as strictly as the host's parser checks it: UTF-8,
    an object with a string `type`, and no lone surrogate (even escaped) in any string."""
    message = json.loads(payload.decode("utf-8"))
    assert isinstance(message, dict) and isinstance(message.get("type"), str), message
    json.dumps(message, ensure_ascii=False).encode("utf-8")  # raises on a lone surrogate
    return message


def frame(message):
    payload = json.dumps(message).encode()
    return len(payload).to_bytes(4, "big") + payload


class Execution:
    """Everything one execution produced, with arrival times (time.monotonic())."""

    def __init__(self, exec_id, sock, out_mark, err_mark):
        self.id = exec_id
        self.sock = sock  # the kernel's socket it was sent on
        self.out_mark, self.err_mark = out_mark, err_mark  # output seen before it started
        self.started = time.monotonic()
        self.frames = []  # (time, message) for this id, `done` included
        self.stdout_chunks = []  # (time, bytes)
        self.stderr_chunks = []
        self.done_at = None

    @property
    def stdout(self):
        return b"".join(c for _, c in self.stdout_chunks).decode("utf-8", "replace")

    @property
    def stderr(self):
        return b"".join(c for _, c in self.stderr_chunks).decode("utf-8", "replace")

    @property
    def messages(self):
        return [m for _, m in self.frames]

    @property
    def results(self):
        return [m for m in self.messages if m["type"] == "result"]

    @property
    def errors(self):
        return [m for m in self.messages if m["type"] == "error"]

    @property
    def status(self):
        return self.messages[-1]["status"]

    @property
    def main_result(self):
        mains = [r for r in self.results if r["is_main_result"]]
        assert len(mains) <= 1, mains
        return mains[0]["data"] if mains else None


class Kernel:
    def __init__(self, argv, env=None, cwd=None, extra_sockets=0):
        """Starts `argv` with fd 3 connected to this object; with `extra_sockets`, fds 4,
        5, ... are further socketpair ends (for tests that fork kernels themselves)."""
        pairs = [socket.socketpair() for _ in range(1 + extra_sockets)]
        child_fds = [theirs.fileno() for _, theirs in pairs]

        def place_sockets():
            # Copies above the targets first (a target may be one of the originals), then
            # into 3, 4, ...; dup2 makes the targets inheritable, the copies close on exec.
            copies = [fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 64) for fd in child_fds]
            for target, fd in enumerate(copies, start=3):
                os.dup2(fd, target)

        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=kernel_env() if env is None else env,
            cwd=cwd,
            close_fds=False,  # fds made in place_sockets are inheritable; Python's own are not
            preexec_fn=place_sockets,
        )
        for _, theirs in pairs:
            theirs.close()
        self.sockets = [ours for ours, _ in pairs]
        self.sock = self.sockets[0]
        self.inbox = {sock: bytearray() for sock in self.sockets}
        self.frames = {sock: [] for sock in self.sockets}  # decoded, not yet consumed
        self.stdout_chunks = []
        self.stderr_chunks = []
        self.selector = selectors.DefaultSelector()
        for sock in self.sockets:
            self.selector.register(sock, selectors.EVENT_READ, "socket")
        self.selector.register(self.proc.stdout, selectors.EVENT_READ, "stdout")
        self.selector.register(self.proc.stderr, selectors.EVENT_READ, "stderr")
        self.next_id = 1

    # -- plumbing -----------------------------------------------------------------------

    def _pump(self, timeout):
        """Reads whatever arrives within `timeout`; false when nothing did."""
        events = self.selector.select(timeout)
        for key, _ in events:
            now = time.monotonic()
            if key.data == "socket":
                data = key.fileobj.recv(1 << 20)
                if not data:
                    self.selector.unregister(key.fileobj)
                    continue
                buf = self.inbox[key.fileobj]
                buf += data
                while len(buf) >= 4 and len(buf) >= 4 + int.from_bytes(buf[:4], "big"):
                    size = int.from_bytes(buf[:4], "big")
                    message = decode_strictly(bytes(buf[4 : 4 + size]))
                    del buf[: 4 + size]
                    self.frames[key.fileobj].append((now, message))
            else:
                data = os.read(key.fileobj.fileno(), 1 << 20)
                if not data:
                    self.selector.unregister(key.fileobj)
                    continue
                chunks = self.stdout_chunks if key.data == "stdout" else self.stderr_chunks
                chunks.append((now, data))
        return bool(events)

    def next_frame(self, sock=None, timeout=60):
        sock = sock or self.sock
        deadline = time.monotonic() + timeout
        while not self.frames[sock]:
            left = deadline - time.monotonic()
            assert left > 0, f"no frame within {timeout} s; stderr: {self.stderr_text()}"
            if not self._pump(min(left, 0.5)) and self.proc.poll() is not None and not self.frames[sock]:
                self._pump(0)
                if not self.frames[sock]:
                    raise AssertionError(f"kernel exited ({self.proc.returncode}); stderr: {self.stderr_text()}")
        return self.frames[sock].pop(0)

    def stderr_text(self):
        return b"".join(c for _, c in self.stderr_chunks).decode("utf-8", "replace")

    def stdout_text(self):
        return b"".join(c for _, c in self.stdout_chunks).decode("utf-8", "replace")

    def drain_output(self):
        """Reads what is already in the pipes, like the host after `done`."""
        while self._pump(0):
            pass

    # -- protocol -----------------------------------------------------------------------

    def wait_ready(self, sock=None, timeout=60):
        _, message = self.next_frame(sock, timeout)
        assert message["type"] == "ready", message
        return message

    def send(self, message, sock=None):
        (sock or self.sock).sendall(frame(message))

    def start(self, code, sock=None):
        exec_id = f"e{self.next_id}"
        self.next_id += 1
        self.drain_output()
        sock = sock or self.sock
        execution = Execution(exec_id, sock, len(self.stdout_chunks), len(self.stderr_chunks))
        self.send({"type": "execute", "id": exec_id, "code": code}, sock)
        return execution

    def start_command(self, argv, cwd=None, env=None, sock=None):
        """Sends a `command` frame; returns its Execution (collect it with wait())."""
        exec_id = f"c{self.next_id}"
        self.next_id += 1
        self.drain_output()
        sock = sock or self.sock
        execution = Execution(exec_id, sock, len(self.stdout_chunks), len(self.stderr_chunks))
        self.send({"type": "command", "id": exec_id, "argv": argv, "cwd": cwd, "env": env or {}}, sock)
        return execution

    def wait(self, execution, timeout=60, interrupt_after=None):
        """Collects frames until `done`, optionally sending SIGINT `interrupt_after`
        seconds after the start; then drains the output pipes."""
        deadline = execution.started + timeout
        interrupt_at = None if interrupt_after is None else execution.started + interrupt_after
        while True:
            if interrupt_at is not None and time.monotonic() >= interrupt_at:
                self.interrupt()
                interrupt_at = None
            if self.frames[execution.sock]:
                at, message = self.frames[execution.sock].pop(0)
                assert message.get("id") == execution.id, message
                execution.frames.append((at, message))
                if message["type"] == "done":
                    execution.done_at = at
                    break
                continue
            left = deadline - time.monotonic()
            assert left > 0, f"no done within {timeout} s; stderr: {self.stderr_text()}"
            wake = left if interrupt_at is None else max(0.0, min(left, interrupt_at - time.monotonic()))
            if not self._pump(min(wake, 0.5)) and self.proc.poll() is not None:
                self._pump(0)
                if not self.frames[execution.sock]:
                    raise AssertionError(f"kernel exited ({self.proc.returncode}); stderr: {self.stderr_text()}")
        self.drain_output()
        execution.stdout_chunks = self.stdout_chunks[execution.out_mark :]
        execution.stderr_chunks = self.stderr_chunks[execution.err_mark :]
        return execution

    def execute(self, code, timeout=60, interrupt_after=None, sock=None):
        return self.wait(self.start(code, sock), timeout, interrupt_after)

    def command(self, argv, cwd=None, env=None, timeout=60, interrupt_after=None):
        return self.wait(self.start_command(argv, cwd, env), timeout, interrupt_after)

    def wait_exit(self, timeout=60):
        """Reads frames and output until the process has exited and closed its pipes;
        returns its exit status."""
        deadline = time.monotonic() + timeout
        while self.selector.get_map():
            left = deadline - time.monotonic()
            assert left > 0, f"still running after {timeout} s; stderr: {self.stderr_text()}"
            self._pump(min(left, 0.5))
        return self.proc.wait(timeout=max(0.1, deadline - time.monotonic()))

    def interrupt(self):
        os.kill(self.proc.pid, signal.SIGINT)

    def close(self, timeout=10):
        """Hangs up (EOF on fd 3) and returns the kernel's exit status."""
        for sock in self.sockets:
            sock.close()
        try:
            deadline = time.monotonic() + timeout
            while self.proc.poll() is None and time.monotonic() < deadline:
                self._pump(0.1)
            return self.proc.wait(timeout=0.1)
        finally:
            self.kill()

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            stream.close()
        for sock in self.sockets:
            sock.close()
