"""The asynchronous twin of ``_processes``: :class:`AsyncProcesses` (``sandbox.processes`` of an
:class:`~corral.AsyncSandbox`) and :class:`AsyncProcessHandle`. Request bodies, URLs and the
folding of the output stream are ``_processes``' own."""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, Any, AsyncIterator, Callable, Dict, List, Mapping, Optional, Sequence, Union

import httpx

from ._common import check_response, wrap_transport_errors
from ._errors import NotFoundError
from ._processes import (
    Input,
    OutputFolder,
    ProcessExit,
    ProcessInfo,
    ProcessOutput,
    input_body,
    output_timeout,
    parse_event,
    process_url,
    resize_body,
    signal_body,
    start_body,
    start_pid,
)

if TYPE_CHECKING:
    from ._async import AsyncSandbox

__all__ = ["AsyncProcesses", "AsyncProcessHandle"]


class AsyncProcessHandle:
    """See :class:`corral.ProcessHandle`: iterate it with ``async for``, or ``await wait()``."""

    pid: int

    def __init__(self, processes: "AsyncProcesses", response: httpx.Response) -> None:
        # Made by ``AsyncProcesses``, which reads the stream's ``start`` event (``_begin``).
        self._processes = processes
        self._response = response
        self._lines = response.aiter_lines()
        self._folder = OutputFolder()

    async def _begin(self) -> None:
        try:
            self.pid = start_pid(await self._next_event())
        except BaseException:
            await self._response.aclose()
            raise

    async def _next_event(self) -> Optional[Dict[str, Any]]:
        with wrap_transport_errors():
            async for line in self._lines:
                event = parse_event(line)
                if event is not None:
                    return event
        return None

    async def __aiter__(self) -> AsyncIterator[ProcessOutput]:
        while self._folder.exit is None:
            event = await self._next_event()
            if event is None:
                self._folder.cut_off()
                break
            chunk = self._folder.feed(event)
            if chunk is not None:
                yield chunk
        await self._response.aclose()

    async def wait(
        self, on_output: Optional[Callable[[ProcessOutput], Any]] = None
    ) -> ProcessExit:
        """Reads the output until the program ends (``on_output``, a function or a coroutine
        function, gets every chunk)."""
        async for chunk in self:
            if on_output is not None:
                outcome = on_output(chunk)
                if inspect.isawaitable(outcome):
                    await outcome
        assert self._folder.exit is not None
        return self._folder.exit

    async def send_stdin(self, data: Input) -> None:
        await self._processes.send_stdin(self.pid, data)

    async def close_stdin(self) -> None:
        await self._processes.close_stdin(self.pid)

    async def resize(self, rows: int, cols: int) -> None:
        await self._processes.resize(self.pid, rows, cols)

    async def kill(self, signal: Union[str, int] = "SIGKILL") -> bool:
        return await self._processes.kill(self.pid, signal)

    async def disconnect(self) -> None:
        """Stops reading; the program goes on (``processes.connect(pid)`` reads it again)."""
        await self._response.aclose()


class AsyncProcesses:
    """See :class:`corral.Processes`."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def _open(
        self, method: str, url: str, body: Optional[Dict[str, Any]]
    ) -> AsyncProcessHandle:
        client = self._sb._conn.client
        request = client.build_request(
            method,
            url,
            json=body,
            headers={"Accept": "application/x-ndjson"},
            timeout=output_timeout(client.timeout),
        )
        with wrap_transport_errors():
            response = await client.send(request, stream=True)
        if response.status_code >= 400:
            await response.aread()
            await response.aclose()
            check_response(response)
        handle = AsyncProcessHandle(self, response)
        await handle._begin()
        return handle

    async def start(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        *,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        tag: Optional[str] = None,
        stdin: bool = False,
        pty: Optional[Sequence[int]] = None,
    ) -> AsyncProcessHandle:
        """See :meth:`corral.Processes.start`."""
        body = start_body(cmd, args, cwd, env, tag, stdin, pty)
        return await self._open("POST", process_url(self._sb.id), body)

    async def list(self) -> List[ProcessInfo]:
        payload = await self._sb._conn.json("GET", process_url(self._sb.id))
        return [ProcessInfo.from_dict(p) for p in payload["processes"]]

    async def connect(self, pid: int) -> AsyncProcessHandle:
        """The running program ``pid``'s output from now on."""
        return await self._open("GET", process_url(self._sb.id, f"/{pid}/output"), None)

    async def send_stdin(self, pid: int, data: Input) -> None:
        """See :meth:`corral.Processes.send_stdin`."""
        await self._sb._conn.request(
            "POST", process_url(self._sb.id, f"/{pid}/input"), json=input_body(data)
        )

    async def close_stdin(self, pid: int) -> None:
        await self._sb._conn.request(
            "POST", process_url(self._sb.id, f"/{pid}/close-stdin"), json={}
        )

    async def resize(self, pid: int, rows: int, cols: int) -> None:
        await self._sb._conn.request(
            "POST", process_url(self._sb.id, f"/{pid}/resize"), json=resize_body(rows, cols)
        )

    async def kill(self, pid: int, signal: Union[str, int] = "SIGKILL") -> bool:
        """See :meth:`corral.Processes.kill`."""
        try:
            await self._sb._conn.request(
                "POST", process_url(self._sb.id, f"/{pid}/signal"), json=signal_body(signal)
            )
        except NotFoundError:
            return False
        return True
