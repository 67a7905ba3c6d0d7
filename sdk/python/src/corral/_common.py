"""What the sync and async clients share: configuration, request bodies, answer parsing and the
folding of the NDJSON event stream (docs/results.md#events). Nothing here does I/O."""

from __future__ import annotations

import base64
import contextlib
import json
import os
from typing import (
    IO,
    Any,
    Callable,
    Dict,
    Iterator,
    List,
    Mapping,
    Optional,
    Sequence,
    Tuple,
    Union,
)
from urllib.parse import quote

import httpx

from ._errors import (
    CorralConnectionError,
    CorralError,
    CorralTimeoutError,
    StreamError,
    error_from_event,
    error_from_response,
)
from ._models import (
    CommandResult,
    EntryInfo,
    Execution,
    ExecutionError,
    FileInfo,
    Limits,
    LimitsLike,
    Logs,
    NetworkLike,
    Policy,
    PolicyLike,
    Result,
)

__version__ = "0.1.0"

DEFAULT_URL = "http://127.0.0.1:8420"
#: Default client-side timeout (seconds) for ordinary requests. Executions and commands wait
#: for their own (server-enforced) timeout instead; see :func:`stream_timeout`.
DEFAULT_TIMEOUT = 60.0
#: Slack added to an execution's ``timeout_s`` before the client gives up reading.
STREAM_SLACK_S = 30.0

TimeoutLike = Union[float, httpx.Timeout, None]
FileData = Union[str, bytes, bytearray, memoryview, IO[bytes], IO[str]]
#: ``{"path": "text" | b"bytes"}`` or a list of ``{"path", "content" | "content_base64"}``.
RunFiles = Union[Mapping[str, Union[str, bytes]], Sequence[Mapping[str, str]]]


def resolve_url(url: Optional[str]) -> str:
    url = url or os.environ.get("CORRAL_URL") or DEFAULT_URL
    return url.rstrip("/")


def resolve_api_key(api_key: Optional[str]) -> Optional[str]:
    if api_key is not None:
        return api_key
    return os.environ.get("CORRAL_API_KEY") or None


def client_headers(api_key: Optional[str]) -> Dict[str, str]:
    headers = {"User-Agent": f"corral-python/{__version__}"}
    if api_key:
        headers["Authorization"] = f"Bearer {api_key}"
    return headers


def base_timeout(timeout: TimeoutLike) -> httpx.Timeout:
    return timeout if isinstance(timeout, httpx.Timeout) else httpx.Timeout(timeout)


def stream_timeout(timeout: httpx.Timeout, timeout_s: Optional[float]) -> httpx.Timeout:
    """The timeout for an execution or command: the server enforces the execution's limit, so
    the client waits that long plus slack (or indefinitely when the limit is the session's
    default, which the client may not know)."""
    read = None if timeout_s is None else float(timeout_s) + STREAM_SLACK_S
    return httpx.Timeout(connect=timeout.connect, read=read, write=timeout.write, pool=timeout.pool)


@contextlib.contextmanager
def wrap_transport_errors() -> Iterator[None]:
    """Turns ``httpx`` transport failures into :class:`CorralConnectionError`."""
    try:
        yield
    except httpx.TimeoutException as e:
        raise CorralTimeoutError(f"request to Corral timed out: {e}") from e
    except httpx.TransportError as e:
        raise CorralConnectionError(f"could not talk to Corral: {e}") from e


def check_response(response: httpx.Response) -> None:
    """Raises the :class:`CorralError` for an error answer (its body must have been read)."""
    if response.status_code >= 400:
        raise error_from_response(response.status_code, response.headers, response.content)


def json_body(response: httpx.Response) -> Any:
    check_response(response)
    try:
        return response.json()
    except ValueError as e:
        raise CorralError(f"the server answered {response.status_code} with invalid JSON") from e


# ---- request bodies -------------------------------------------------------------------------


def limits_dict(limits: Optional[LimitsLike]) -> Optional[Dict[str, Any]]:
    if limits is None:
        return None
    if isinstance(limits, Limits):
        return limits.to_dict()
    return {k: v for k, v in dict(limits).items() if v is not None}


def policy_dict(policy: Optional[PolicyLike]) -> Optional[Dict[str, Any]]:
    if policy is None:
        return None
    if isinstance(policy, Policy):
        return policy.to_dict()
    return {k: v for k, v in dict(policy).items() if v is not None}


def network_dict(network: Optional[NetworkLike]) -> Optional[Dict[str, Any]]:
    """The API's ``network`` object: a list of hosts is its ``allow``."""
    if network is None:
        return None
    if isinstance(network, Mapping):
        return dict(network)
    if isinstance(network, str):
        raise TypeError("network: give a list of hosts, not one string")
    return {"allow": list(network)}


def _drop_none(body: Dict[str, Any]) -> Dict[str, Any]:
    return {k: v for k, v in body.items() if v is not None}


def create_body(
    language: Optional[str],
    image: Optional[str],
    limits: Optional[LimitsLike],
    env: Optional[Mapping[str, str]],
    idle_timeout_s: Optional[int],
    policy: Optional[PolicyLike] = None,
    metadata: Optional[Mapping[str, str]] = None,
    network: Optional[NetworkLike] = None,
) -> Dict[str, Any]:
    return _drop_none(
        {
            "image": image,
            "language": language,
            "limits": limits_dict(limits),
            "env": dict(env) if env is not None else None,
            "idle_timeout_s": idle_timeout_s,
            "policy": policy_dict(policy),
            "metadata": dict(metadata) if metadata is not None else None,
            "network": network_dict(network),
        }
    )


def list_params(
    state: Optional[Sequence[str]],
    image: Optional[str],
    metadata: Optional[Mapping[str, str]],
    after: Optional[str],
) -> Dict[str, str]:
    """The query of ``GET /v1/sandboxes`` for one page."""
    params = {f"metadata.{k}": v for k, v in (metadata or {}).items()}
    if state:
        params["state"] = ",".join(state)
    if image is not None:
        params["image"] = image
    if after is not None:
        params["after"] = after
    return params


def execute_body(
    code: str,
    language: Optional[str],
    timeout_s: Optional[float],
    context: Optional[str] = None,
    env: Optional[Mapping[str, str]] = None,
) -> Dict[str, Any]:
    return _drop_none(
        {
            "code": code,
            "language": language,
            "timeout_s": timeout_s,
            "context": context,
            "env": dict(env) if env else None,
        }
    )


def command_body(
    cmd: str,
    args: Optional[Sequence[str]],
    cwd: Optional[str],
    env: Optional[Mapping[str, str]],
    timeout_s: Optional[float],
) -> Dict[str, Any]:
    return _drop_none(
        {
            "cmd": cmd,
            "args": list(args) if args is not None else None,
            "cwd": cwd,
            "env": dict(env) if env is not None else None,
            "timeout_s": timeout_s,
        }
    )


def run_files(files: Optional[RunFiles]) -> Optional[List[Dict[str, str]]]:
    if files is None:
        return None
    if isinstance(files, Mapping):
        out: List[Dict[str, str]] = []
        for path, content in files.items():
            if isinstance(content, str):
                out.append({"path": path, "content": content})
            else:
                out.append(
                    {"path": path, "content_base64": base64.b64encode(bytes(content)).decode()}
                )
        return out
    return [dict(f) for f in files]


def run_body(
    code: str,
    language: Optional[str],
    image: Optional[str],
    limits: Optional[LimitsLike],
    files: Optional[RunFiles],
    env: Optional[Mapping[str, str]],
    policy: Optional[PolicyLike] = None,
    network: Optional[NetworkLike] = None,
) -> Dict[str, Any]:
    return _drop_none(
        {
            "code": code,
            "language": language,
            "image": image,
            "limits": limits_dict(limits),
            "env": dict(env) if env is not None else None,
            "files": run_files(files),
            "policy": policy_dict(policy),
            "network": network_dict(network),
        }
    )


def file_data(data: FileData) -> bytes:
    """The bytes to upload for ``files.write``: ``str`` is encoded as UTF-8, a file object is
    read to its end."""
    if isinstance(data, str):
        return data.encode("utf-8")
    if isinstance(data, (bytes, bytearray, memoryview)):
        return bytes(data)
    content = data.read()
    return content.encode("utf-8") if isinstance(content, str) else bytes(content)


def file_url(sandbox_id: str, path: str) -> str:
    """``/v1/sandboxes/{id}/files/{path}`` with every segment percent-encoded.

    Dot segments are encoded too (``..`` → ``%2E%2E``), and a leading ``/`` becomes ``%2F``, so
    that the server — not the HTTP stack's URL normalisation — judges the path (and refuses it
    with ``invalid_path``)."""

    def segment(s: str) -> str:
        if s and set(s) == {"."}:
            return "%2E" * len(s)
        return quote(s, safe="")

    encoded = "/".join(segment(s) for s in path.split("/"))
    if encoded.startswith("/"):
        encoded = "%2F" + encoded[1:]
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}/files/{encoded}"


def sandbox_url(sandbox_id: str, suffix: str = "") -> str:
    return f"/v1/sandboxes/{quote(sandbox_id, safe='')}{suffix}"


def parse_file_list(payload: Any) -> List[FileInfo]:
    files = payload.get("files", []) if isinstance(payload, dict) else []
    return [FileInfo.from_dict(f) for f in files]


def parse_entry_list(payload: Any) -> List[EntryInfo]:
    entries = payload.get("entries", []) if isinstance(payload, dict) else []
    return [EntryInfo.from_dict(e) for e in entries]


# ---- the event stream -----------------------------------------------------------------------

#: One callback to make: ``("stdout", str)``, ``("stderr", str)``, ``("result", Result)`` or
#: ``("error", ExecutionError)``.
Dispatch = Tuple[str, Any]

StdCallback = Callable[[str], Any]
ResultCallback = Callable[[Result], Any]
ErrorCallback = Callable[[ExecutionError], Any]


class EventFolder:
    """Folds the NDJSON events of an execution or a command into its result.

    Feed it every line with :meth:`feed`; each call returns the callbacks to make, in order.
    After the stream, :meth:`execution` or :meth:`command_result` gives the folded result.
    """

    def __init__(self) -> None:
        self.stdout: List[str] = []
        self.stderr: List[str] = []
        self.results: List[Result] = []
        self.error: Optional[ExecutionError] = None
        self.end: Optional[Dict[str, Any]] = None

    def feed(self, line: str) -> List[Dispatch]:
        line = line.strip()
        if not line:
            return []
        try:
            event = json.loads(line)
        except ValueError as e:
            raise StreamError(f"the server sent a line that is not JSON: {line[:200]!r}") from e
        if not isinstance(event, dict):
            raise StreamError(f"the server sent a line that is not a JSON object: {line[:200]!r}")
        kind = event.get("type")
        if kind is None:
            if isinstance(event.get("error"), dict):
                raise error_from_event(event)
            if "status" in event:
                return self._fold_result_object(event)
            return []
        if self.end is not None:
            return []  # nothing follows `end`; ignore rather than mis-fold
        if kind == "stdout":
            text = str(event.get("text", ""))
            self.stdout.append(text)
            return [("stdout", text)]
        if kind == "stderr":
            text = str(event.get("text", ""))
            self.stderr.append(text)
            return [("stderr", text)]
        if kind == "result":
            result = Result.from_dict(event)
            self.results.append(result)
            return [("result", result)]
        if kind == "error":
            error = ExecutionError.from_dict(event)
            self.error = error
            return [("error", error)]
        if kind == "end":
            self.end = event
            return []
        return []  # an event type this SDK does not know yet

    def _fold_result_object(self, obj: Dict[str, Any]) -> List[Dispatch]:
        """A whole result object (docs/results.md) in place of a stream, as if streamed."""
        events: List[Dict[str, Any]] = []
        if obj.get("stdout"):
            events.append({"type": "stdout", "text": obj["stdout"]})
        if obj.get("stderr"):
            events.append({"type": "stderr", "text": obj["stderr"]})
        events.extend(dict(r, type="result") for r in obj.get("results") or [])
        if isinstance(obj.get("error"), dict):
            events.append(dict(obj["error"], type="error"))
        events.append(dict(obj, type="end"))
        out: List[Dispatch] = []
        for event in events:
            out.extend(self.feed(json.dumps(event)))
        return out

    def _require_end(self) -> Dict[str, Any]:
        if self.end is None:
            raise StreamError("the event stream ended before its `end` event")
        return self.end

    def execution(self) -> Execution:
        end = self._require_end()
        return Execution(
            logs=Logs(stdout=list(self.stdout), stderr=list(self.stderr)),
            results=list(self.results),
            error=self.error,
            status=str(end.get("status", "")),
            execution_time_ms=int(end.get("execution_time_ms") or 0),
            cpu_time_ms=int(end.get("cpu_time_ms") or 0),
            peak_memory_bytes=int(end.get("peak_memory_bytes") or 0),
            error_message=end.get("error_message"),
            warnings=end_warnings(end),
            network=end_network(end),
        )

    def command_result(self) -> CommandResult:
        end = self._require_end()
        exit_code = end.get("exit_code")
        return CommandResult(
            stdout="".join(self.stdout),
            stderr="".join(self.stderr),
            exit_code=int(exit_code) if exit_code is not None else None,
            status=str(end.get("status", "")),
            execution_time_ms=int(end.get("execution_time_ms") or 0),
            cpu_time_ms=int(end.get("cpu_time_ms") or 0),
            peak_memory_bytes=int(end.get("peak_memory_bytes") or 0),
            error_message=end.get("error_message"),
            warnings=end_warnings(end),
            network=end_network(end),
        )


def end_network(end: Mapping[str, Any]) -> Optional[Dict[str, Any]]:
    """The ``network`` of an ``end`` event (or of a folded result object): egress totals."""
    network = end.get("network")
    return dict(network) if isinstance(network, Mapping) else None


def end_warnings(end: Mapping[str, Any]) -> List[str]:
    """The ``warnings`` of an ``end`` event (or of a folded result object)."""
    warnings = end.get("warnings")
    return [str(w) for w in warnings] if isinstance(warnings, list) else []


def callback_map(
    on_stdout: Optional[StdCallback] = None,
    on_stderr: Optional[StdCallback] = None,
    on_result: Optional[ResultCallback] = None,
    on_error: Optional[ErrorCallback] = None,
) -> Dict[str, Callable[[Any], Any]]:
    callbacks: Dict[str, Callable[[Any], Any]] = {}
    for kind, cb in (
        ("stdout", on_stdout),
        ("stderr", on_stderr),
        ("result", on_result),
        ("error", on_error),
    ):
        if cb is not None:
            callbacks[kind] = cb
    return callbacks


def command_failed(result: CommandResult) -> bool:
    """Whether ``check=True`` should raise for ``result``."""
    return result.exit_code != 0
