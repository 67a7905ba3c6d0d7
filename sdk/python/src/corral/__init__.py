"""Python SDK for Corral, a self-hosted sandbox for untrusted code.

    from corral import Sandbox

    with Sandbox() as sb:
        sb.run_code("import pandas as pd; df = pd.DataFrame({'a': [1, 2]})")
        print(sb.run_code("df.a.sum()").text)      # 3

See README.md for more; the HTTP API it speaks is docs/api.md.
"""

from ._async import AsyncCommands, AsyncFiles, AsyncSandbox, async_run
from ._common import DEFAULT_TIMEOUT, DEFAULT_URL, __version__
from ._errors import (
    AuthenticationError,
    CommandExitError,
    CorralConnectionError,
    CorralError,
    CorralTimeoutError,
    InsufficientStorageError,
    InvalidPathError,
    InvalidRequestError,
    NetworkNotAllowedError,
    NotFoundError,
    PayloadTooLargeError,
    RateLimitError,
    RetryLaterError,
    SandboxDeadError,
    SandboxError,
    ServiceUnavailableError,
    StreamError,
)
from ._models import (
    CommandResult,
    Execution,
    ExecutionError,
    FileInfo,
    Limits,
    Logs,
    Result,
    RunResult,
    SandboxInfo,
)
from ._sync import Commands, Files, Sandbox, run

__all__ = [
    "__version__",
    "DEFAULT_URL",
    "DEFAULT_TIMEOUT",
    # clients
    "Sandbox",
    "Files",
    "Commands",
    "run",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncCommands",
    "async_run",
    # data
    "Limits",
    "Execution",
    "Logs",
    "Result",
    "ExecutionError",
    "FileInfo",
    "CommandResult",
    "RunResult",
    "SandboxInfo",
    # errors
    "CorralError",
    "InvalidRequestError",
    "NetworkNotAllowedError",
    "InsufficientStorageError",
    "InvalidPathError",
    "AuthenticationError",
    "NotFoundError",
    "SandboxError",
    "SandboxDeadError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RetryLaterError",
    "ServiceUnavailableError",
    "CorralConnectionError",
    "CorralTimeoutError",
    "StreamError",
    "CommandExitError",
]
