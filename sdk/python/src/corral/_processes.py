"""Processes in a sandbox beside its interpreter (``sandbox.processes``): started with pipes or
a terminal, listed, connected to, fed input, resized and signalled (docs/api.md, "Processes");
and the code contexts it can run besides (:class:`CodeContext`)."""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Mapping, Optional, Sequence, Union

import httpx

from ._common import check_response, sandbox_url, wrap_transport_errors
from ._errors import NotFoundError

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


class ProcessHandle:
    """A started (or connected-to) program and its output stream.

    Iterate it for :class:`ProcessOutput` chunks, or call :meth:`wait`. :meth:`disconnect`
    closes the stream and leaves the program running; :meth:`kill` ends it."""

    def __init__(self, processes: "Processes", response: httpx.Response) -> None:
        self._processes = processes
        self._response = response
        self._lines = response.iter_lines()
        self._exit: Optional[ProcessExit] = None
        self._lost = 0
        start = self._next_event()
        if start is None or start.get("type") != "start":
            response.close()
            raise RuntimeError(f"the process stream did not start: {start!r}")
        self.pid: int = int(start["pid"])

    def _next_event(self) -> Optional[Dict[str, Any]]:
        with wrap_transport_errors():
            for line in self._lines:
                if line.strip():
                    return json.loads(line)
        return None

    def __iter__(self) -> Iterator[ProcessOutput]:
        while self._exit is None:
            event = self._next_event()
            if event is None:
                self._exit = ProcessExit(None, None, self._lost, "the stream ended without an end")
                break
            kind = event.get("type")
            if kind in ("stdout", "stderr", "pty"):
                yield ProcessOutput(kind, base64.b64decode(event["data"]))
            elif kind == "lost":
                self._lost += int(event.get("bytes", 0))
            elif kind == "end":
                self._exit = ProcessExit(
                    event.get("exit_code"), event.get("signal"), self._lost, event.get("error")
                )
        self._response.close()

    def wait(self, on_output: Optional[Callable[[ProcessOutput], Any]] = None) -> ProcessExit:
        """Reads the output until the program ends (``on_output`` gets every chunk)."""
        for chunk in self:
            if on_output is not None:
                on_output(chunk)
        assert self._exit is not None
        return self._exit

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

    def _url(self, suffix: str = "") -> str:
        return sandbox_url(self._sb.id, "/processes" + suffix)

    def _open(self, method: str, url: str, body: Optional[Dict[str, Any]]) -> ProcessHandle:
        client = self._sb._conn.client
        request = client.build_request(
            method,
            url,
            json=body,
            headers={"Accept": "application/x-ndjson"},
            # The stream says it is alive every 20 s; a program may be silent much longer.
            timeout=httpx.Timeout(client.timeout.connect, read=None),
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
        return self._open("POST", self._url(), body)

    def list(self) -> List[ProcessInfo]:
        payload = self._sb._conn.json("GET", self._url())
        return [ProcessInfo.from_dict(p) for p in payload["processes"]]

    def connect(self, pid: int) -> ProcessHandle:
        """The running program ``pid``'s output from now on."""
        return self._open("GET", self._url(f"/{pid}/output"), None)

    def send_stdin(self, pid: int, data: Input) -> None:
        """Input for ``pid``; a program that does not read makes this fail (429) once 64 KiB
        wait for it."""
        if isinstance(data, str):
            body = {"data": data}
        else:
            body = {"data_base64": base64.b64encode(data).decode()}
        self._sb._conn.request("POST", self._url(f"/{pid}/input"), json=body)

    def close_stdin(self, pid: int) -> None:
        self._sb._conn.request("POST", self._url(f"/{pid}/close-stdin"), json={})

    def resize(self, pid: int, rows: int, cols: int) -> None:
        self._sb._conn.request("POST", self._url(f"/{pid}/resize"), json={"rows": rows, "cols": cols})

    def kill(self, pid: int, signal: Union[str, int] = "SIGKILL") -> bool:
        """Sends ``signal`` to the program's process group: ``True``, or ``False`` when ``pid``
        is not a running program of this sandbox."""
        try:
            self._sb._conn.request("POST", self._url(f"/{pid}/signal"), json={"signal": signal})
        except NotFoundError:
            return False
        return True
