"""The asynchronous client: :class:`AsyncSandbox` and the one-shot :func:`async_run`.

Same API as the synchronous one, with coroutines; callbacks may be plain functions or
coroutine functions. Request bodies, answer parsing and event folding are shared with the
synchronous client (``_common``)."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Dict, List, Literal, Mapping, Optional, Sequence, overload

import httpx

from ._common import (
    DEFAULT_TIMEOUT,
    EventFolder,
    ErrorCallback,
    FileData,
    ResultCallback,
    RunFiles,
    StdCallback,
    TimeoutLike,
    base_timeout,
    callback_map,
    check_response,
    client_headers,
    command_body,
    command_failed,
    create_body,
    execute_body,
    file_data,
    file_url,
    json_body,
    list_params,
    parse_entry_list,
    parse_file_list,
    resolve_api_key,
    resolve_url,
    run_body,
    sandbox_url,
    stream_timeout,
    wrap_transport_errors,
)
from ._async_processes import AsyncProcesses
from ._errors import CommandExitError, CorralError, NotFoundError
from ._models import (
    CommandResult,
    EntryInfo,
    Execution,
    FileInfo,
    LimitsLike,
    NetworkLike,
    PolicyLike,
    RunResult,
    SandboxInfo,
    SandboxMetric,
)
from ._processes import CodeContext, context_body, context_url, parse_context_list

__all__ = ["AsyncSandbox", "AsyncFiles", "AsyncCommands", "async_run"]


class _AsyncConnection:
    """An ``httpx.AsyncClient`` bound to one server and key; re-opened after ``aclose()``."""

    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: TimeoutLike) -> None:
        self.url = resolve_url(url)
        self.api_key = resolve_api_key(api_key)
        self.timeout = base_timeout(timeout)
        self._client: Optional[httpx.AsyncClient] = None

    @property
    def client(self) -> httpx.AsyncClient:
        if self._client is None or self._client.is_closed:
            self._client = httpx.AsyncClient(
                base_url=self.url, headers=client_headers(self.api_key), timeout=self.timeout
            )
        return self._client

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None

    async def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with wrap_transport_errors():
            response = await self.client.request(method, path, **kwargs)
        check_response(response)
        return response

    async def json(self, method: str, path: str, **kwargs: Any) -> Any:
        with wrap_transport_errors():
            response = await self.client.request(method, path, **kwargs)
        return json_body(response)

    async def stream(
        self,
        path: str,
        body: Dict[str, Any],
        timeout_s: Optional[float],
        callbacks: Mapping[str, Callable[[Any], Any]],
    ) -> EventFolder:
        folder = EventFolder()
        with wrap_transport_errors():
            async with self.client.stream(
                "POST",
                path,
                json=body,
                headers={"Accept": "application/x-ndjson"},
                timeout=stream_timeout(self.timeout, timeout_s),
            ) as response:
                if response.status_code >= 400:
                    await response.aread()
                    check_response(response)
                async for line in response.aiter_lines():
                    for kind, payload in folder.feed(line):
                        callback = callbacks.get(kind)
                        if callback is not None:
                            outcome = callback(payload)
                            if inspect.isawaitable(outcome):
                                await outcome
        return folder


class AsyncSandbox:
    """The asynchronous twin of :class:`corral.Sandbox`::

        async with await AsyncSandbox.create() as sb:     # or: async with AsyncSandbox() as sb
            execution = await sb.run_code("1 + 1")

    The constructor does no I/O: the session is created by :meth:`create` or on entering
    ``async with``.
    """

    def __init__(
        self,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        language: str = "python",
        image: Optional[str] = None,
        limits: Optional[LimitsLike] = None,
        env: Optional[Mapping[str, str]] = None,
        idle_timeout_s: Optional[int] = None,
        policy: Optional[PolicyLike] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkLike] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> None:
        self._conn = _AsyncConnection(url, api_key, timeout)
        self._create_body: Optional[Dict[str, Any]] = create_body(
            language, image, limits, env, idle_timeout_s, policy, metadata, network
        )
        self._info: Optional[SandboxInfo] = None
        self.files = AsyncFiles(self)
        self.commands = AsyncCommands(self)
        self.processes = AsyncProcesses(self)

    @classmethod
    async def create(
        cls,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        language: str = "python",
        image: Optional[str] = None,
        limits: Optional[LimitsLike] = None,
        env: Optional[Mapping[str, str]] = None,
        idle_timeout_s: Optional[int] = None,
        policy: Optional[PolicyLike] = None,
        metadata: Optional[Mapping[str, str]] = None,
        network: Optional[NetworkLike] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> "AsyncSandbox":
        """Creates a session (``POST /v1/sandboxes``)."""
        sb = cls(
            url,
            api_key,
            language=language,
            image=image,
            limits=limits,
            env=env,
            idle_timeout_s=idle_timeout_s,
            policy=policy,
            metadata=metadata,
            network=network,
            timeout=timeout,
        )
        await sb._ensure_created()
        return sb

    async def _ensure_created(self) -> None:
        if self._info is not None:
            return
        try:
            payload = await self._conn.json("POST", "/v1/sandboxes", json=self._create_body)
        except BaseException:
            await self._conn.aclose()
            raise
        self._info = SandboxInfo.from_dict(payload)

    @classmethod
    async def connect(
        cls,
        sandbox_id: str,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> "AsyncSandbox":
        """Attaches to an existing session; raises :class:`NotFoundError` if there is none."""
        sb = cls(url, api_key, timeout=timeout)
        sb._create_body = None
        try:
            payload = await sb._conn.json("GET", sandbox_url(sandbox_id))
        except BaseException:
            await sb._conn.aclose()
            raise
        sb._info = SandboxInfo.from_dict(payload)
        return sb

    @staticmethod
    async def list(
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        state: Optional[Sequence[str]] = None,
        image: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> List[SandboxInfo]:
        """See :meth:`corral.Sandbox.list`."""
        conn = _AsyncConnection(url, api_key, timeout)
        found: List[SandboxInfo] = []
        after: Optional[str] = None
        try:
            while True:
                payload = await conn.json(
                    "GET", "/v1/sandboxes", params=list_params(state, image, metadata, after)
                )
                found.extend(SandboxInfo.from_dict(s) for s in payload.get("sandboxes", []))
                after = payload.get("next")
                if not after:
                    return found
        finally:
            await conn.aclose()

    @property
    def info(self) -> SandboxInfo:
        if self._info is None:
            raise CorralError(
                "the session is not created yet: use `await AsyncSandbox.create(...)` "
                "or `async with AsyncSandbox(...)`"
            )
        return self._info

    @property
    def id(self) -> str:
        return self.info.id

    @property
    def sandbox_id(self) -> str:
        return self.info.id

    @property
    def image(self) -> str:
        return self.info.image

    @property
    def language(self) -> str:
        return self.info.language

    @property
    def url(self) -> str:
        return self._conn.url

    async def get_info(self) -> SandboxInfo:
        """Fetches the session's current state."""
        self._info = SandboxInfo.from_dict(await self._conn.json("GET", sandbox_url(self.id)))
        return self._info

    async def metrics(self) -> List[SandboxMetric]:
        """See :meth:`corral.Sandbox.metrics`."""
        payload = await self._conn.json("GET", sandbox_url(self.id, "/metrics"))
        return [SandboxMetric.from_dict(m) for m in payload.get("metrics", [])]

    async def pause(self) -> SandboxInfo:
        """Pauses the session (see :meth:`corral.Sandbox.pause`)."""
        self._info = SandboxInfo.from_dict(
            await self._conn.json("POST", sandbox_url(self.id, "/pause"))
        )
        return self._info

    async def resume(self) -> SandboxInfo:
        """Resumes a paused session (see :meth:`corral.Sandbox.resume`)."""
        self._info = SandboxInfo.from_dict(
            await self._conn.json("POST", sandbox_url(self.id, "/resume"))
        )
        return self._info

    async def run_code(
        self,
        code: str,
        language: Optional[str] = None,
        timeout_s: Optional[float] = None,
        on_stdout: Optional[StdCallback] = None,
        on_stderr: Optional[StdCallback] = None,
        on_result: Optional[ResultCallback] = None,
        on_error: Optional[ErrorCallback] = None,
        *,
        context: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
    ) -> Execution:
        """See :meth:`corral.Sandbox.run_code`."""
        folder = await self._conn.stream(
            sandbox_url(self.id, "/execute"),
            execute_body(code, language, timeout_s, context, env),
            timeout_s,
            callback_map(on_stdout, on_stderr, on_result, on_error),
        )
        return folder.execution()

    async def create_context(
        self, language: str = "python", cwd: Optional[str] = None
    ) -> CodeContext:
        """See :meth:`corral.Sandbox.create_context`."""
        payload = await self._conn.json(
            "POST", sandbox_url(self.id, "/contexts"), json=context_body(language, cwd)
        )
        return CodeContext.from_dict(payload)

    async def list_contexts(self) -> List[CodeContext]:
        """See :meth:`corral.Sandbox.list_contexts`."""
        return parse_context_list(await self._conn.json("GET", sandbox_url(self.id, "/contexts")))

    async def restart_context(self, context_id: str) -> None:
        """See :meth:`corral.Sandbox.restart_context`."""
        await self._conn.request("POST", context_url(self.id, context_id, "/restart"))

    async def remove_context(self, context_id: str) -> None:
        """See :meth:`corral.Sandbox.remove_context`."""
        await self._conn.request("DELETE", context_url(self.id, context_id))

    async def kill(self) -> bool:
        """Kills the session; ``False`` if the server no longer knew it."""
        try:
            await self._conn.request("DELETE", sandbox_url(self.id))
        except NotFoundError:
            return False
        return True

    async def close(self) -> None:
        """Closes the HTTP connection without killing the session."""
        await self._conn.aclose()

    async def __aenter__(self) -> "AsyncSandbox":
        await self._ensure_created()
        return self

    async def __aexit__(self, *exc: object) -> None:
        try:
            await self.kill()
        finally:
            await self.close()

    def __repr__(self) -> str:
        if self._info is None:
            return "AsyncSandbox(<not created>)"
        return f"AsyncSandbox(id={self.id!r}, image={self.image!r}, language={self.language!r})"


class AsyncFiles:
    """See :class:`corral.Files`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def write(self, path: str, data: FileData) -> FileInfo:
        payload = await self._sb._conn.json(
            "PUT",
            file_url(self._sb.id, path),
            content=file_data(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileInfo.from_dict(payload)

    @overload
    async def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    async def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    async def read(self, path: str, format: str = "text") -> Any:
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text" or "bytes"')
        response = await self._sb._conn.request("GET", file_url(self._sb.id, path))
        return response.content if format == "bytes" else response.content.decode("utf-8")

    async def list(self, dir: Optional[str] = None) -> List[FileInfo]:
        params = {"dir": dir} if dir is not None else None
        payload = await self._sb._conn.json(
            "GET", sandbox_url(self._sb.id, "/files"), params=params
        )
        return parse_file_list(payload)

    async def remove(self, path: str, *, recursive: bool = False) -> None:
        if recursive:
            await self._sb._conn.request(
                "POST", sandbox_url(self._sb.id, "/files:remove"), json={"path": path}
            )
        else:
            await self._sb._conn.request("DELETE", file_url(self._sb.id, path))

    async def stat(self, path: str) -> EntryInfo:
        payload = await self._sb._conn.json(
            "GET", sandbox_url(self._sb.id, "/files:stat"), params={"path": path}
        )
        return EntryInfo.from_dict(payload)

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
        except NotFoundError:
            return False
        return True

    async def list_dir(self, path: str = "", depth: int = 1) -> List[EntryInfo]:
        payload = await self._sb._conn.json(
            "GET",
            sandbox_url(self._sb.id, "/files:list"),
            params={"path": path, "depth": depth},
        )
        return parse_entry_list(payload)

    async def make_dir(self, path: str) -> bool:
        response = await self._sb._conn.request(
            "POST", sandbox_url(self._sb.id, "/files:mkdir"), json={"path": path}
        )
        return response.status_code == 201

    async def move(self, source: str, destination: str) -> EntryInfo:
        payload = await self._sb._conn.json(
            "POST",
            sandbox_url(self._sb.id, "/files:move"),
            json={"from": source, "to": destination},
        )
        return EntryInfo.from_dict(payload)


class AsyncCommands:
    """See :class:`corral.Commands`."""

    def __init__(self, sandbox: AsyncSandbox) -> None:
        self._sb = sandbox

    async def run(
        self,
        cmd: str,
        args: Optional[Sequence[str]] = None,
        cwd: Optional[str] = None,
        env: Optional[Mapping[str, str]] = None,
        timeout_s: Optional[float] = None,
        on_stdout: Optional[StdCallback] = None,
        on_stderr: Optional[StdCallback] = None,
        *,
        check: bool = False,
    ) -> CommandResult:
        """See :meth:`corral.Commands.run` (a non-zero exit raises only with ``check=True``)."""
        folder = await self._sb._conn.stream(
            sandbox_url(self._sb.id, "/commands"),
            command_body(cmd, args, cwd, env, timeout_s),
            timeout_s,
            callback_map(on_stdout, on_stderr),
        )
        result = folder.command_result()
        if check and command_failed(result):
            raise CommandExitError(result)
        return result


async def async_run(
    code: str,
    language: str = "python",
    url: Optional[str] = None,
    api_key: Optional[str] = None,
    image: Optional[str] = None,
    limits: Optional[LimitsLike] = None,
    files: Optional[RunFiles] = None,
    env: Optional[Mapping[str, str]] = None,
    *,
    policy: Optional[PolicyLike] = None,
    network: Optional[NetworkLike] = None,
    timeout: TimeoutLike = DEFAULT_TIMEOUT,
) -> RunResult:
    """See :func:`corral.run`."""
    conn = _AsyncConnection(url, api_key, timeout)
    body = run_body(code, language, image, limits, files, env, policy, network)
    timeout_s = body.get("limits", {}).get("timeout_s")
    try:
        payload = await conn.json(
            "POST", "/v1/run", json=body, timeout=stream_timeout(conn.timeout, timeout_s)
        )
    finally:
        await conn.aclose()
    return RunResult.from_dict(payload)
