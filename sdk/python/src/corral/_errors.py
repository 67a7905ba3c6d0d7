"""Exceptions raised by the Corral SDK.

Every error the server answers (``{"error": {"code", "message"}}`` with an HTTP status) becomes
a :class:`CorralError` subclass chosen by status and code. Network failures (refused
connection, timeouts, a connection cut mid-stream) become :class:`CorralConnectionError`
with the original ``httpx`` exception as ``__cause__``.
"""

from __future__ import annotations

import datetime
import email.utils
import json
from typing import Mapping, Optional, Type

__all__ = [
    "CorralError",
    "InvalidRequestError",
    "InsufficientStorageError",
    "InvalidPathError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "SandboxError",
    "SandboxDeadError",
    "PayloadTooLargeError",
    "RetryLaterError",
    "RateLimitError",
    "ServiceUnavailableError",
    "CorralConnectionError",
    "CorralTimeoutError",
    "StreamError",
    "CommandExitError",
]


class CorralError(Exception):
    """Base class of every error raised by this SDK.

    ``code`` is the server's error code (``not_found``, ``bad_request``, …) when the error came
    from the server, and ``status_code`` its HTTP status (``None`` for client-side errors).
    """

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status_code: Optional[int] = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code
        self.status_code = status_code

    def __str__(self) -> str:
        if self.status_code is not None and self.code:
            return f"{self.message} ({self.status_code} {self.code})"
        return self.message


class InvalidRequestError(CorralError):
    """400 ``bad_request`` / ``invalid_path``, 422 ``unknown_image`` / ``unsupported_language``."""


class InvalidPathError(InvalidRequestError):
    """400 ``invalid_path``: absolute path, ``..``, empty, or through a link."""


class AuthenticationError(CorralError):
    """401 ``unauthorized``: missing or unknown API key."""


class ForbiddenError(AuthenticationError):
    """403 ``forbidden``: a keyless request that is not from a local program, or a ``policy``
    that would widen the API key's code policy (the message names what it would widen)."""


class NetworkNotAllowedError(CorralError):
    """403 ``network_not_allowed``: the network policy asked for is outside what the server's
    operator allows (the message names the host)."""


class NotFoundError(CorralError):
    """404 ``not_found``: unknown sandbox (or another key's), unknown route; ``file_not_found``:
    no such file or directory in a live sandbox's workspace; 410 ``sandbox_gone``: behind
    ``corral route``, the sandbox's node stopped answering and took its sandboxes with it."""


class PathExistsError(CorralError):
    """409 ``file_exists``: something is already at the destination of ``files.move``, which
    never replaces anything."""


class SandboxError(CorralError):
    """500 ``sandbox_error`` (Corral could not build or run the sandbox) and 409 ``sandbox_dead``."""


class SandboxDeadError(SandboxError):
    """409 ``sandbox_dead``: the session's kernel died; kill it and create another."""


class SandboxStateError(CorralError):
    """409 for a call that does not fit the session's state: ``sandbox_paused`` (resume it
    first), ``sandbox_not_paused``, ``sandbox_busy`` (a pause while it executes) and
    ``pause_unsupported`` (no cgroup freezer on the server's host)."""


class PayloadTooLargeError(CorralError):
    """413 ``payload_too_large``: a request body or uploaded file over the server's limit."""


class InsufficientStorageError(CorralError):
    """507 ``insufficient_storage``: an uploaded file does not fit the sandbox (its workspace is
    full, or it would take the sandbox past its memory limit); nothing of it was written."""


class RetryLaterError(CorralError):
    """A refusal the server expects to lift: 429 and 503. ``retry_after`` is its
    ``Retry-After`` header in seconds (``None`` when it sent none)."""

    def __init__(
        self,
        message: str,
        *,
        code: Optional[str] = None,
        status_code: Optional[int] = None,
        retry_after: Optional[float] = None,
    ) -> None:
        super().__init__(message, code=code, status_code=status_code)
        self.retry_after = retry_after


class RateLimitError(RetryLaterError):
    """429 ``too_many_sandboxes`` (session limits, or no run slot within the admission wait),
    ``too_many_processes``, ``too_many_streams`` and ``process_input_full`` (a program that
    does not read its input)."""


class ServiceUnavailableError(RetryLaterError):
    """503 ``zygote_restarting`` (the image's zygote is being replaced),
    ``memory_budget_committed`` (the host's memory budget is promised to live sandboxes) and
    ``shutting_down`` (the server is stopping)."""


class CorralConnectionError(CorralError):
    """The server could not be reached, or the connection failed mid-request."""


class CorralTimeoutError(CorralConnectionError):
    """The HTTP request timed out on the client side (see the ``timeout`` parameter)."""


class StreamError(CorralError):
    """An event stream ended without its ``end`` event or carried a line that is not JSON."""


class CommandExitError(CorralError):
    """Raised by ``commands.run(..., check=True)`` when the command did not succeed."""

    def __init__(self, result: "object", message: Optional[str] = None) -> None:
        exit_code = getattr(result, "exit_code", None)
        status = getattr(result, "status", None)
        super().__init__(
            message or f"command exited with code {exit_code} (status {status})",
            code="command_failed",
        )
        #: The :class:`corral.CommandResult` of the failed command.
        self.result = result
        self.exit_code: Optional[int] = exit_code
        self.stdout: str = getattr(result, "stdout", "")
        self.stderr: str = getattr(result, "stderr", "")


_BY_CODE: Mapping[str, Type[CorralError]] = {
    "bad_request": InvalidRequestError,
    "invalid_path": InvalidPathError,
    "unknown_image": InvalidRequestError,
    "unsupported_language": InvalidRequestError,
    "unauthorized": AuthenticationError,
    "forbidden": ForbiddenError,
    "network_not_allowed": NetworkNotAllowedError,
    "not_found": NotFoundError,
    "file_not_found": NotFoundError,
    "file_exists": PathExistsError,
    "sandbox_gone": NotFoundError,
    "sandbox_dead": SandboxDeadError,
    "sandbox_paused": SandboxStateError,
    "sandbox_not_paused": SandboxStateError,
    "sandbox_busy": SandboxStateError,
    "pause_unsupported": SandboxStateError,
    "sandbox_error": SandboxError,
    "payload_too_large": PayloadTooLargeError,
    "insufficient_storage": InsufficientStorageError,
    "too_many_sandboxes": RateLimitError,
    "zygote_restarting": ServiceUnavailableError,
    "memory_budget_committed": ServiceUnavailableError,
    "shutting_down": ServiceUnavailableError,
    "process_not_found": NotFoundError,
    "process_not_started": InvalidRequestError,
    "process_has_no_input": InvalidRequestError,
    "too_many_processes": RateLimitError,
    "process_input_full": RateLimitError,
    "too_many_streams": RateLimitError,
}

_BY_STATUS: Mapping[int, Type[CorralError]] = {
    400: InvalidRequestError,
    401: AuthenticationError,
    403: ForbiddenError,
    404: NotFoundError,
    410: NotFoundError,
    409: SandboxDeadError,
    413: PayloadTooLargeError,
    422: InvalidRequestError,
    429: RateLimitError,
    500: SandboxError,
    503: ServiceUnavailableError,
    507: InsufficientStorageError,
}


def _retry_after(headers: Mapping[str, str]) -> Optional[float]:
    """``Retry-After`` in seconds: delay-seconds (what Corral sends), or an HTTP date."""
    value = headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when.tzinfo is None:
        when = when.replace(tzinfo=datetime.timezone.utc)
    return max(0.0, (when - datetime.datetime.now(datetime.timezone.utc)).total_seconds())


def error_from_response(
    status_code: int, headers: Mapping[str, str], body: bytes
) -> CorralError:
    """The exception for an HTTP error answer (status >= 400)."""
    code: Optional[str] = None
    message: Optional[str] = None
    try:
        payload = json.loads(body.decode("utf-8")) if body else None
    except (UnicodeDecodeError, ValueError):
        payload = None
    if isinstance(payload, dict) and isinstance(payload.get("error"), dict):
        err = payload["error"]
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else None
    if message is None:
        text = body.decode("utf-8", "replace").strip() if body else ""
        message = text[:500] or f"HTTP {status_code}"
    cls = _BY_CODE.get(code or "") or _BY_STATUS.get(status_code)
    if cls is None:
        cls = InvalidRequestError if 400 <= status_code < 500 else CorralError
    if issubclass(cls, RetryLaterError):
        return cls(message, code=code, status_code=status_code, retry_after=_retry_after(headers))
    return cls(message, code=code, status_code=status_code)


def error_from_event(payload: Mapping[str, object]) -> CorralError:
    """The exception for an ``{"error": {"code", "message"}}`` object found inside a stream."""
    err = payload.get("error")
    code = message = None
    if isinstance(err, dict):
        code = err.get("code") if isinstance(err.get("code"), str) else None
        message = err.get("message") if isinstance(err.get("message"), str) else None
    cls = _BY_CODE.get(code or "", CorralError)
    return cls(message or "the server reported an error mid-stream", code=code)
