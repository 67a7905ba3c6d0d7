"""Python SDK for Corral, a self-hosted sandbox for untrusted code.

    from corral import Sandbox

    with Sandbox() as sb:
        sb.run_code("import pandas as pd; df = pd.DataFrame({'a': [1, 2]})")
        print(sb.run_code("df.a.sum()").text)      # 3

See README.md for more; the HTTP API it speaks is docs/api.md.
"""

from ._async import AsyncCommands, AsyncFiles, AsyncSandbox, async_run
from ._async_processes import AsyncProcesses, AsyncProcessHandle
from ._common import DEFAULT_TIMEOUT, DEFAULT_URL, __version__
from ._errors import (
    AuthenticationError,
    CommandExitError,
    CorralConnectionError,
    CorralError,
    CorralTimeoutError,
    ForbiddenError,
    InsufficientStorageError,
    InvalidPathError,
    InvalidRequestError,
    NetworkNotAllowedError,
    NotFoundError,
    PathExistsError,
    PayloadTooLargeError,
    RateLimitError,
    RetryLaterError,
    SandboxDeadError,
    SandboxStateError,
    SandboxError,
    ServiceUnavailableError,
    StreamError,
)
from ._models import (
    CommandResult,
    EntryInfo,
    Execution,
    ExecutionError,
    FileInfo,
    Limits,
    Logs,
    Policy,
    Result,
    RunResult,
    SandboxInfo,
    Violation,
    SandboxMetric,
)
from ._processes import (
    CodeContext,
    ProcessExit,
    ProcessHandle,
    ProcessInfo,
    Processes,
    ProcessOutput,
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
    "Processes",
    "CodeContext",
    "ProcessHandle",
    "ProcessInfo",
    "ProcessOutput",
    "ProcessExit",
    "run",
    "AsyncSandbox",
    "AsyncFiles",
    "AsyncCommands",
    "AsyncProcesses",
    "AsyncProcessHandle",
    "async_run",
    # data
    "Limits",
    "Policy",
    "Violation",
    "Execution",
    "Logs",
    "Result",
    "ExecutionError",
    "FileInfo",
    "EntryInfo",
    "CommandResult",
    "RunResult",
    "SandboxInfo",
    "SandboxMetric",
    # errors
    "CorralError",
    "InvalidRequestError",
    "NetworkNotAllowedError",
    "InsufficientStorageError",
    "InvalidPathError",
    "AuthenticationError",
    "ForbiddenError",
    "NotFoundError",
    "PathExistsError",
    "SandboxError",
    "SandboxDeadError",
    "SandboxStateError",
    "PayloadTooLargeError",
    "RateLimitError",
    "RetryLaterError",
    "ServiceUnavailableError",
    "CorralConnectionError",
    "CorralTimeoutError",
    "StreamError",
    "CommandExitError",
]
