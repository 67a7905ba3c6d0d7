"""The synchronous client: :class:`Sandbox` and the one-shot :func:`run`."""

from __future__ import annotations

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
from ._errors import CommandExitError, NotFoundError
from ._processes import CodeContext, Processes, context_body, context_url, parse_context_list
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

__all__ = ["Sandbox", "Files", "Commands", "run"]


class _Connection:
    """An ``httpx.Client`` bound to one server and key; re-opened if used after ``close()``."""

    def __init__(self, url: Optional[str], api_key: Optional[str], timeout: TimeoutLike) -> None:
        self.url = resolve_url(url)
        self.api_key = resolve_api_key(api_key)
        self.timeout = base_timeout(timeout)
        self._client: Optional[httpx.Client] = None

    @property
    def client(self) -> httpx.Client:
        if self._client is None or self._client.is_closed:
            self._client = httpx.Client(
                base_url=self.url, headers=client_headers(self.api_key), timeout=self.timeout
            )
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def request(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        with wrap_transport_errors():
            response = self.client.request(method, path, **kwargs)
        check_response(response)
        return response

    def json(self, method: str, path: str, **kwargs: Any) -> Any:
        with wrap_transport_errors():
            response = self.client.request(method, path, **kwargs)
        return json_body(response)

    def stream(
        self,
        path: str,
        body: Dict[str, Any],
        timeout_s: Optional[float],
        callbacks: Mapping[str, Callable[[Any], Any]],
    ) -> EventFolder:
        """POSTs ``body`` and folds the NDJSON answer, calling ``callbacks`` as events arrive.

        An exception raised by a callback closes the stream, which interrupts the execution on
        the server, and propagates to the caller."""
        folder = EventFolder()
        with wrap_transport_errors():
            with self.client.stream(
                "POST",
                path,
                json=body,
                headers={"Accept": "application/x-ndjson"},
                timeout=stream_timeout(self.timeout, timeout_s),
            ) as response:
                if response.status_code >= 400:
                    response.read()
                    check_response(response)
                for line in response.iter_lines():
                    for kind, payload in folder.feed(line):
                        callback = callbacks.get(kind)
                        if callback is not None:
                            callback(payload)
        return folder


class Sandbox:
    """A session: a sandbox holding a live interpreter whose state survives between calls.

    Constructing one creates the session on the server (``POST /v1/sandboxes``)::

        with Sandbox() as sb:            # killed when the block ends
            sb.run_code("x = 41")
            print(sb.run_code("x + 1").text)   # "42"

    ``url`` defaults to ``$CORRAL_URL``, else ``http://127.0.0.1:8420``; ``api_key`` to
    ``$CORRAL_API_KEY`` (no ``Authorization`` header when neither is set). ``timeout`` is the
    client-side timeout of ordinary requests (seconds or an ``httpx.Timeout``); executions and
    commands wait for their own server-side timeout instead. ``policy`` (a :class:`Policy` or a
    dict) narrows the API key's code policy for every execution of the session (``info.policy``
    shows the result); code it refuses is an execution with ``error.name ==
    "PolicyViolation"``, none of it run.
    """

    id: str
    image: str
    language: str
    info: SandboxInfo

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
        self._init(_Connection(url, api_key, timeout))
        try:
            payload = self._conn.json(
                "POST",
                "/v1/sandboxes",
                json=create_body(language, image, limits, env, idle_timeout_s, policy, metadata, network),
            )
        except BaseException:
            self._conn.close()
            raise
        self._apply(SandboxInfo.from_dict(payload))

    def _init(self, conn: _Connection) -> None:
        self._conn = conn
        self.files = Files(self)
        self.commands = Commands(self)
        self.processes = Processes(self)

    def _apply(self, info: SandboxInfo) -> None:
        self.info = info
        self.id = info.id
        self.image = info.image
        self.language = info.language

    # ---- attaching and listing ------------------------------------------------------------

    @classmethod
    def connect(
        cls,
        sandbox_id: str,
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> "Sandbox":
        """Attaches to an existing session; raises :class:`NotFoundError` if there is none."""
        sb = cls.__new__(cls)
        sb._init(_Connection(url, api_key, timeout))
        try:
            payload = sb._conn.json("GET", sandbox_url(sandbox_id))
        except BaseException:
            sb._conn.close()
            raise
        sb._apply(SandboxInfo.from_dict(payload))
        return sb

    @staticmethod
    def list(
        url: Optional[str] = None,
        api_key: Optional[str] = None,
        *,
        state: Optional[Sequence[str]] = None,
        image: Optional[str] = None,
        metadata: Optional[Mapping[str, str]] = None,
        timeout: TimeoutLike = DEFAULT_TIMEOUT,
    ) -> List[SandboxInfo]:
        """The sessions of this API key (or of the local tenant), in creation order: only those
        in one of ``state`` (``running``, ``paused``, ``dead``), of ``image``, and whose
        metadata holds every entry of ``metadata``. Follows every page."""
        conn = _Connection(url, api_key, timeout)
        found: List[SandboxInfo] = []
        after: Optional[str] = None
        try:
            while True:
                payload = conn.json(
                    "GET", "/v1/sandboxes", params=list_params(state, image, metadata, after)
                )
                found.extend(SandboxInfo.from_dict(s) for s in payload.get("sandboxes", []))
                after = payload.get("next")
                if not after:
                    return found
        finally:
            conn.close()

    @property
    def sandbox_id(self) -> str:
        return self.id

    @property
    def url(self) -> str:
        return self._conn.url

    def get_info(self) -> SandboxInfo:
        """Fetches the session's current state (``running``/``dead``, executions, expiry…)."""
        info = SandboxInfo.from_dict(self._conn.json("GET", sandbox_url(self.id)))
        self.info = info
        return info

    # ---- running code ---------------------------------------------------------------------

    def run_code(
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
        """Runs ``code`` in the session, calling the callbacks as events arrive.

        A program that fails does not raise: the :class:`Execution` says how it ended
        (``status``, ``error``). Errors of the request itself (unknown sandbox, dead kernel,
        bad arguments) raise :class:`CorralError` subclasses. ``language`` other than the
        session's runs in that language's default code context (started on first use);
        ``context`` (an id from :meth:`create_context`) runs in that context. ``env`` is set
        for this execution only. ``timeout_s`` defaults to the session's ``limits.timeout_s``.
        """
        folder = self._conn.stream(
            sandbox_url(self.id, "/execute"),
            execute_body(code, language, timeout_s, context, env),
            timeout_s,
            callback_map(on_stdout, on_stderr, on_result, on_error),
        )
        return folder.execution()

    # ---- code contexts --------------------------------------------------------------------

    def create_context(self, language: str = "python", cwd: Optional[str] = None) -> CodeContext:
        """A new interpreter of ``language`` in the sandbox, on its files (``cwd``: an absolute
        path, default ``/workspace``); pass its ``id`` as ``run_code(context=)``."""
        payload = self._conn.json(
            "POST", sandbox_url(self.id, "/contexts"), json=context_body(language, cwd)
        )
        return CodeContext.from_dict(payload)

    def list_contexts(self) -> List[CodeContext]:
        """The session's contexts: its own kernel's (``default-<language>``) first."""
        return parse_context_list(self._conn.json("GET", sandbox_url(self.id, "/contexts")))

    def restart_context(self, context_id: str) -> None:
        """Restarts context ``context_id``'s interpreter: its variables are gone."""
        self._conn.request("POST", context_url(self.id, context_id, "/restart"))

    def remove_context(self, context_id: str) -> None:
        """Stops context ``context_id``'s interpreter and forgets the context."""
        self._conn.request("DELETE", context_url(self.id, context_id))

    # ---- lifetime -------------------------------------------------------------------------

    def metrics(self) -> List[SandboxMetric]:
        """Samples of the session's usage: one every five seconds over the last ten minutes,
        oldest first, and one of now."""
        payload = self._conn.json("GET", sandbox_url(self.id, "/metrics"))
        return [SandboxMetric.from_dict(m) for m in payload.get("metrics", [])]

    def pause(self) -> SandboxInfo:
        """Pauses the session between executions: every process is frozen, keeping its memory
        and files, and its idle clock stops. Until :meth:`resume`, running code, commands and
        files raise :class:`SandboxStateError` (``sandbox_paused``)."""
        self.info = SandboxInfo.from_dict(self._conn.json("POST", sandbox_url(self.id, "/pause")))
        return self.info

    def resume(self) -> SandboxInfo:
        """Resumes a paused session with every process and variable as it was."""
        self.info = SandboxInfo.from_dict(self._conn.json("POST", sandbox_url(self.id, "/resume")))
        return self.info

    def kill(self) -> bool:
        """Kills the session. Returns ``False`` if the server no longer knew it (already killed
        or expired), ``True`` otherwise."""
        try:
            self._conn.request("DELETE", sandbox_url(self.id))
        except NotFoundError:
            return False
        return True

    def close(self) -> None:
        """Closes the HTTP connection without killing the session."""
        self._conn.close()

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: object) -> None:
        try:
            self.kill()
        finally:
            self.close()

    def __repr__(self) -> str:
        return f"Sandbox(id={self.id!r}, image={self.image!r}, language={self.language!r})"


class Files:
    """The session's workspace (``/workspace``); paths are relative to it."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def write(self, path: str, data: FileData) -> FileInfo:
        """Writes ``data`` (``str`` as UTF-8, ``bytes``, or a file object read to its end) to
        ``path``, creating parent directories and replacing an existing file."""
        payload = self._sb._conn.json(
            "PUT",
            file_url(self._sb.id, path),
            content=file_data(data),
            headers={"Content-Type": "application/octet-stream"},
        )
        return FileInfo.from_dict(payload)

    @overload
    def read(self, path: str, format: Literal["text"] = "text") -> str: ...

    @overload
    def read(self, path: str, format: Literal["bytes"]) -> bytes: ...

    def read(self, path: str, format: str = "text") -> Any:
        """The file's content: ``str`` (decoded as UTF-8) for ``format="text"``, ``bytes`` for
        ``format="bytes"``. A missing file raises :class:`NotFoundError`."""
        if format not in ("text", "bytes"):
            raise ValueError('format must be "text" or "bytes"')
        response = self._sb._conn.request("GET", file_url(self._sb.id, path))
        return response.content if format == "bytes" else response.content.decode("utf-8")

    def list(self, dir: Optional[str] = None) -> List[FileInfo]:
        """Every regular file below ``dir`` (default: the whole workspace), sorted by path."""
        params = {"dir": dir} if dir is not None else None
        payload = self._sb._conn.json("GET", sandbox_url(self._sb.id, "/files"), params=params)
        return parse_file_list(payload)

    def remove(self, path: str, *, recursive: bool = False) -> None:
        """Deletes a regular file; a missing one raises :class:`NotFoundError`. With
        ``recursive=True`` it removes whatever is at ``path``: a directory with everything in
        it, or a link as itself (never what it points to)."""
        if recursive:
            self._sb._conn.request(
                "POST", sandbox_url(self._sb.id, "/files:remove"), json={"path": path}
            )
        else:
            self._sb._conn.request("DELETE", file_url(self._sb.id, path))

    def stat(self, path: str) -> EntryInfo:
        """What is at ``path`` (``""``: the workspace itself); a link is reported as a link.
        A missing path raises :class:`NotFoundError`."""
        payload = self._sb._conn.json(
            "GET", sandbox_url(self._sb.id, "/files:stat"), params={"path": path}
        )
        return EntryInfo.from_dict(payload)

    def exists(self, path: str) -> bool:
        """Whether anything (a file, directory, link…) is at ``path``."""
        try:
            self.stat(path)
        except NotFoundError:
            return False
        return True

    def list_dir(self, path: str = "", depth: int = 1) -> List[EntryInfo]:
        """The entries of directory ``path``, ``depth`` levels of them (1 to 32), each
        directory followed by its entries, names sorted. Links are listed, never entered; a
        listing past 10,000 entries raises :class:`InvalidRequestError`."""
        payload = self._sb._conn.json(
            "GET",
            sandbox_url(self._sb.id, "/files:list"),
            params={"path": path, "depth": depth},
        )
        return parse_entry_list(payload)

    def make_dir(self, path: str) -> bool:
        """Makes directory ``path`` and its missing parents: ``True`` if made, ``False`` if it
        was already a directory."""
        response = self._sb._conn.request(
            "POST", sandbox_url(self._sb.id, "/files:mkdir"), json={"path": path}
        )
        return response.status_code == 201

    def move(self, source: str, destination: str) -> EntryInfo:
        """Moves (renames) ``source`` to ``destination``, making missing directories on the
        way; never replaces anything (an existing ``destination`` raises
        :class:`PathExistsError`). Returns what is now at ``destination``."""
        payload = self._sb._conn.json(
            "POST",
            sandbox_url(self._sb.id, "/files:move"),
            json={"from": source, "to": destination},
        )
        return EntryInfo.from_dict(payload)


class Commands:
    """Commands run inside the session's sandbox (same workspace and limits), leaving the
    interpreter's state alone."""

    def __init__(self, sandbox: Sandbox) -> None:
        self._sb = sandbox

    def run(
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
        """Runs ``cmd``: a shell command line (``bash -c``) without ``args``, else the program
        ``cmd`` with ``args`` and no shell.

        A non-zero exit does **not** raise: read ``exit_code``. With ``check=True`` a command
        whose exit code is not 0 (or that did not exit, e.g. on timeout) raises
        :class:`CommandExitError`, which carries the result.
        """
        folder = self._sb._conn.stream(
            sandbox_url(self._sb.id, "/commands"),
            command_body(cmd, args, cwd, env, timeout_s),
            timeout_s,
            callback_map(on_stdout, on_stderr),
        )
        result = folder.command_result()
        if check and command_failed(result):
            raise CommandExitError(result)
        return result


def run(
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
    """Runs ``code`` once in a fresh sandbox (``POST /v1/run``) and returns its result object.

    ``files`` are put in the workspace first: ``{"path": "text" or b"bytes"}``. A failing
    program does not raise; see ``status``, ``exit_code`` and ``error``. ``policy`` (a
    :class:`Policy` or a dict) narrows the API key's code policy for this run: a program it
    refuses comes back with status ``error``, ``error.name == "PolicyViolation"`` and
    ``error.violations``, none of it run; one that would widen the key's raises
    :class:`ForbiddenError`.
    """
    conn = _Connection(url, api_key, timeout)
    body = run_body(code, language, image, limits, files, env, policy, network)
    timeout_s = body.get("limits", {}).get("timeout_s")
    try:
        payload = conn.json(
            "POST",
            "/v1/run",
            json=body,
            timeout=stream_timeout(conn.timeout, timeout_s),
        )
    finally:
        conn.close()
    return RunResult.from_dict(payload)
