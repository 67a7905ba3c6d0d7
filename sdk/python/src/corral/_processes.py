"""Processes in a sandbox beside its interpreter (``sandbox.processes``): started with pipes or
a terminal, listed, connected to, fed input, resized and signalled (docs/api.md, "Processes");
and the code contexts it can run besides (:class:`CodeContext`)."""

from __future__ import annotations

import base64
import json
from urllib.parse import quote
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from ._common import check_response, sandbox_url, wrap_transport_errors
from ._errors import NotFoundError, StreamError

if TYPE_CHECKING:
    from ._sync import Sandbox

__all__ = [
    "CodeContext",
    "Processes",
    "ProcessHandle",
    "ProcessInfo",
    "ProcessOutput",
    "ProcessExit",
]


@dataclass(frozen=True)
class CodeContext:
    """An interpreter of the sandbox besides its own kernel (``Sandbox.create_context``)."""

    id: str
    language: str
    cwd: Optional[str]

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "CodeContext":
        return cls(id=str(d["id"]), language=str(d["language"]), cwd=d.get("cwd"))


@dataclass(frozen=True)
class ProcessOutput:
    """A chunk of a program's output: ``stream`` is ``"stdout"``, ``"stderr"`` or ``"pty"``."""

    stream: str
    data: bytes


@dataclass(frozen=True)
class ProcessExit:
    """How a program ended: its ``exit_code``, or the ``signal`` that killed it. ``lost_bytes``
    counts output this client did not read in time (the server keeps at most 256 KiB for it);
    ``error`` is set when the sandbox's process agent went away first."""

    exit_code: Optional[int]
    signal: Optional[int]
    lost_bytes: int = 0
    error: Optional[str] = None


@dataclass(frozen=True)
class ProcessInfo:
    """A running program, as ``processes.list()`` shows it."""

    pid: int
    cmd: str
    args: List[str]
    cwd: Optional[str]
    env: Dict[str, str] = field(default_factory=dict)
    tag: Optional[str] = None
    pty: bool = False

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "ProcessInfo":
        return cls(
            pid=int(d["pid"]),
            cmd=str(d["cmd"]),
            args=[str(a) for a in d.get("args") or []],
            cwd=d.get("cwd"),
            env=dict(d.get("env") or {}),
            tag=d.get("tag"),
            pty=bool(d.get("pty")),
        )


Input = Union[str, bytes]


# ---- what the sync and async clients share (no I/O) ----------------------------------------


def context_body(language: str, cwd: Optional[str]) -> Dict[str, Any]:
    """The body of ``POST …/contexts``."""
    body: Dict[str, Any] = {"language": language}
    if cwd is not None:
        body["cwd"] = cwd
    return body


def parse_context_list(payload: Any) -> List[CodeContext]:
    return [CodeContext.from_dict(c) for c in payload["contexts"]]


def context_url(sandbox_id: str, context_id: str, suffix: str = "") -> str:
    return sandbox_url(sandbox_id, f"/contexts/{quote(context_id, safe='')}{suffix}")


def process_url(sandbox_id: str, suffix: str = "") -> str:
    return sandbox_url(sandbox_id, "/processes" + suffix)


def start_body(
    cmd: str,
    args: Optional[Sequence[str]],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    tag: Optional[str],
    stdin: bool,
    pty: Optional[Sequence[int]],
) -> Dict[str, Any]:
    """The body of ``POST …/processes``."""
    body: Dict[str, Any] = {"cmd": cmd, "args": list(args or []), "stdin": stdin}
    if cwd is not None:
        body["cwd"] = cwd
    if env:
        body["env"] = dict(env)
    if tag is not None:
        body["tag"] = tag
    if pty is not None:
        rows, cols = pty
        body["pty"] = {"rows": rows, "cols": cols}
    return body


def input_body(data: Input) -> Dict[str, str]:
    """The body of ``POST …/processes/{pid}/input``: text as is, bytes in base64."""
    if isinstance(data, str):
        return {"data": data}
    return {"data_base64": base64.b64encode(data).decode()}


def signal_body(signal: Union[str, int]) -> Dict[str, Union[str, int]]:
    return {"signal": signal}


def resize_body(rows: int, cols: int) -> Dict[str, int]:
    return {"rows": rows, "cols": cols}


def output_timeout(client_timeout: httpx.Timeout) -> httpx.Timeout:
    """An output stream's timeout: the client's to connect, none to read (the stream says it
    is alive every 20 s, but a program may be silent much longer)."""
    return httpx.Timeout(client_timeout.connect, read=None)


def parse_event(line: str) -> Optional[Dict[str, Any]]:
    """A line of a process's output stream (``None``: a blank line)."""
    if not line.strip():
        return None
    event = json.loads(line)
    if not isinstance(event, dict):
        raise StreamError(f"the process stream sent {line[:200]!r}, not an event")
    return event


def start_pid(start: Optional[Mapping[str, Any]]) -> int:
    """The pid of a stream's first event, which must be ``start``."""
    if start is None or start.get("type") != "start":
        raise StreamError(f"the process stream did not start: {start!r}")
    return int(start["pid"])


class OutputFolder:
    """Folds a process's output events into :class:`ProcessOutput` chunks and its
    :class:`ProcessExit`."""

    def __init__(self) -> None:
        self.exit: Optional[ProcessExit] = None
        self._lost = 0

    def feed(self, event: Mapping[str, Any]) -> Optional[ProcessOutput]:
        """The chunk an event carries, if any; an ``end`` event sets :attr:`exit`."""
        kind = event.get("type")
        if kind in ("stdout", "stderr", "pty"):
            return ProcessOutput(str(kind), base64.b64decode(event["data"]))
        if kind == "lost":
            self._lost += int(event.get("bytes", 0))
        elif kind == "end":
            self.exit = ProcessExit(
                event.get("exit_code"), event.get("signal"), self._lost, event.get("error")
            )
        return None

    def cut_off(self) -> None:
        """The stream ended without an ``end`` event."""
        self.exit = ProcessExit(None, None, self._lost, "the stream ended without an end")


class ProcessHandle:
    """A started (or connected-to) program and its output stream.

    Iterate it for :class:`ProcessOutput` chunks, or call :meth:`wait`. :meth:`disconnect`
    closes the stream and leaves the program running; :meth:`kill` ends it."""

    def __init__(self, processes: "Processes", response: httpx.Response) -> None:
        self._processes = processes
        self._response = response
        self._lines = response.iter_lines()
        self._folder = OutputFolder()
        try:
            self.pid: int = start_pid(self._next_event())
        except BaseException:
            response.close()
            raise

    def _next_event(self) -> Optional[Dict[str, Any]]:
        with wrap_transport_errors():
            for line in self._lines:
                event = parse_event(line)
                if event is not None:
                    return event
        return None

    def __iter__(self) -> Iterator[ProcessOutput]:
        while self._folder.exit is None:
            event = self._next_event()
            if event is None:
                self._folder.cut_off()
                break
            chunk = self._folder.feed(event)
            if chunk is not None:
                yield chunk
        self._response.close()

    def wait(self, on_output: Optional[Callable[[ProcessOutput], Any]] = None) -> ProcessExit:
        """Reads the output until the program ends (``on_output`` gets every chunk)."""
        for chunk in self:
            if on_output is not None:
                on_output(chunk)
        assert self._folder.exit is not None
        return self._folder.exit

    def send_stdin(self, data: Input) -> None:
        self._processes.send_stdin(self.pid, data)

    def close_stdin(self) -> None:
        self._processes.close_stdin(self.pid)

    def resize(self, rows: int, cols: int) -> None:
        self._processes.resize(self.pid, rows, cols)

    def kill(self, signal: Union[str, int] = "SIGKILL") -> bool:
        return self._processes.kill(self.pid, signal)

    def disconnect(self) -> None:
        """Stops reading; the program goes on (``processes.connect(pid)`` reads it again)."""
        self._response.close()


class Processes:
    """Programs that run inside the sandbox beside its interpreter, concurrently with
    ``run_code`` and with each other (at most 32 at once)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _open(self, method: str, url: str, body: Optional[Dict[str, Any]]) -> ProcessHandle:
        client = self._sb._conn.client
        request = client.build_request(
            method,
            url,
            json=body,
            headers={"Accept": "application/x-ndjson"},
            timeout=output_timeout(client.timeout),
        )
        with wrap_transport_errors():
            response = client.send(request, stream=True)
        if response.status_code >= 400:
            response.read()
            response.close()
            check_response(response)
        return ProcessHandle(self, response)

    def start(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        tag: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[Sequence[int]] = None,
    ) -> ProcessHandle:
        """Starts the program ``cmd`` with ``args`` (no shell: use ``"bash", ["-c", line]``).
        ``stdin=True`` gives it a stdin to :meth:`send_stdin` to; ``pty=(rows, cols)`` a
        terminal instead of pipes. Returns at once, with the output stream open."""
        body = start_body(cmd, args, cwd, env, tag, stdin, pty)
        return self._open("POST", process_url(self._sb.id), body)

    def list(self) -> List[ProcessInfo]:
        payload = self._sb._conn.json("GET", process_url(self._sb.id))
        return [ProcessInfo.from_dict(p) for p in payload["processes"]]

    def connect(self, pid: int) -> ProcessHandle:
        """The running program ``pid``'s output from now on."""
        return self._open("GET", process_url(self._sb.id, f"/{pid}/output"), None)

    def send_stdin(self, pid: int, data: Input) -> None:
        """Input for ``pid``; a program that does not read makes this fail (429) once 64 KiB
        wait for it."""
        self._sb._conn.request("POST", process_url(self._sb.id, f"/{pid}/input"), json=input_body(data))

    def close_stdin(self, pid: int) -> None:
        self._sb._conn.request("POST", process_url(self._sb.id, f"/{pid}/close-stdin"), json={})

    def resize(self, pid: int, rows: int, cols: int) -> None:
        self._sb._conn.request(
            "POST", process_url(self._sb.id, f"/{pid}/resize"), json=resize_body(rows, cols)
        )

    def kill(self, pid: int, signal: Union[str, int] = "SIGKILL") -> bool:
        """Sends ``signal`` to the program's process group: ``True``, or ``False`` when ``pid``
        is not a running program of this sandbox."""
        try:
            self._sb._conn.request(
                "POST", process_url(self._sb.id, f"/{pid}/signal"), json=signal_body(signal)
            )
        except NotFoundError:
            return False
        return True
