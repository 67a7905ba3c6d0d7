"""Data classes for what the Corral API returns (docs/results.md and docs/api.md)."""

from __future__ import annotations

import base64
import os
from dataclasses import dataclass, field
from typing import Any, Dict, List, Mapping, Optional, Sequence, Union

__all__ = [
    "Limits",
    "Policy",
    "Violation",
    "Result",
    "Logs",
    "ExecutionError",
    "Execution",
    "FileInfo",
    "CommandResult",
    "RunResult",
    "SandboxInfo",
]

#: The rich formats a :class:`Result` may carry, in the order :meth:`Result.formats` lists them.
RESULT_FORMATS = ("text", "html", "markdown", "svg", "png", "json")


@dataclass
class Limits:
    """Resource limits (all optional; the server applies the defaults of docs/api.md#limits).

    A plain ``dict`` with the same keys is accepted wherever ``limits`` is.
    """

    timeout_s: Optional[float] = None
    memory_mb: Optional[int] = None
    cpus: Optional[float] = None
    pids: Optional[int] = None
    disk_mb: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}


LimitsLike = Union[Limits, Mapping[str, Any]]

#: A network policy: a list of hosts (``"index.example.org"``, ``"*.example.net:443"``), or the
#: API's ``network`` object itself (``{"allow": [...], "cidrs": [...]}``, ``{"default": True}``).
NetworkLike = Union[Sequence[str], Mapping[str, Any]]


@dataclass
class Policy:
    """A code policy (docs/code-policy.md): the modules code may import and its longest length.

    ``allowed_modules``: the only modules allowed (with their submodules; ``[]`` allows none);
    ``denied_modules``: modules refused (they win); ``max_code_bytes``: the longest code. What
    is left out is the API key's; a policy can only narrow the key's (403 otherwise). Defence in
    depth, never a boundary: the sandbox is. A plain ``dict`` with the same keys is accepted
    wherever ``policy`` is.
    """

    allowed_modules: Optional[List[str]] = None
    denied_modules: Optional[List[str]] = None
    max_code_bytes: Optional[int] = None

    def to_dict(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if v is not None}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Policy":
        allowed = data.get("allowed_modules")
        return cls(
            allowed_modules=None if allowed is None else [str(m) for m in allowed],
            denied_modules=[str(m) for m in data.get("denied_modules") or []],
            max_code_bytes=data.get("max_code_bytes"),
        )


PolicyLike = Union[Policy, Mapping[str, Any]]


@dataclass
class Violation:
    """One thing the code policy refused: ``rule`` is ``not_allowed``, ``denied``,
    ``relative`` or ``max_code_bytes``; ``line`` and ``module`` are ``None`` for the last."""

    rule: str
    line: Optional[int] = None
    module: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Violation":
        return cls(rule=str(data.get("rule", "")), line=data.get("line"), module=data.get("module"))


@dataclass
class Result:
    """One rich result of an execution (a MIME bundle).

    Only the formats the program produced are set; ``png`` is the base64 string as the server
    sent it (use :meth:`png_bytes` or :meth:`save_png` for the bytes), ``json`` any JSON value.
    """

    is_main_result: bool = False
    text: Optional[str] = None
    html: Optional[str] = None
    png: Optional[str] = None
    svg: Optional[str] = None
    json: Optional[Any] = None
    markdown: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Result":
        return cls(
            is_main_result=bool(data.get("is_main_result", False)),
            text=data.get("text"),
            html=data.get("html"),
            png=data.get("png"),
            svg=data.get("svg"),
            json=data.get("json"),
            markdown=data.get("markdown"),
        )

    def formats(self) -> List[str]:
        """The names of the formats present, e.g. ``["text", "png"]``."""
        return [name for name in RESULT_FORMATS if getattr(self, name) is not None]

    def png_bytes(self) -> bytes:
        """The decoded PNG; raises ``ValueError`` when this result has none."""
        if self.png is None:
            raise ValueError("this result has no PNG")
        return base64.b64decode(self.png)

    def save_png(self, path: Union[str, "os.PathLike[str]"]) -> None:
        """Writes the decoded PNG to ``path``; raises ``ValueError`` when there is none."""
        data = self.png_bytes()
        with open(path, "wb") as f:
            f.write(data)

    def __str__(self) -> str:
        return self.text if self.text is not None else repr(self)


@dataclass
class Logs:
    """The output chunks of an execution, in the order they arrived."""

    stdout: List[str] = field(default_factory=list)
    stderr: List[str] = field(default_factory=list)


@dataclass
class ExecutionError:
    """A language-level exception raised by the executed code.

    A ``PolicyViolation`` (the code policy refused the code, or an import while it ran) also
    lists what it refused in ``violations``; other errors have none.
    """

    name: str
    value: str
    traceback: str
    violations: List[Violation] = field(default_factory=list)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ExecutionError":
        return cls(
            name=str(data.get("name", "")),
            value=str(data.get("value", "")),
            traceback=str(data.get("traceback", "")),
            violations=[Violation.from_dict(v) for v in data.get("violations") or []],
        )


@dataclass
class Execution:
    """What one ``run_code`` produced.

    ``status`` is the server's: ``success``, ``error`` (an exception), ``timeout``,
    ``memory_limit`` or ``sandbox_error``. A failing program does not raise: look at
    ``status`` and ``error``.
    """

    logs: Logs = field(default_factory=Logs)
    results: List[Result] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    status: str = "success"
    execution_time_ms: int = 0
    cpu_time_ms: int = 0
    peak_memory_bytes: int = 0
    #: A human-readable sentence for a status other than ``success``, when the server gives one.
    error_message: Optional[str] = None
    #: The server's warnings: protections weaker than asked for, and what was dropped over the
    #: per-execution bounds (e.g. rich results beyond the limit), as the ``end`` event says.
    warnings: List[str] = field(default_factory=list)
    #: What the sandbox's egress proxy did while it ran, as :attr:`RunResult.network`;
    #: ``None`` without a network policy.
    network: Optional[Dict[str, Any]] = None

    @property
    def text(self) -> Optional[str]:
        """The text of the main result (the value of the last expression), if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None

    @property
    def stdout(self) -> str:
        return "".join(self.logs.stdout)

    @property
    def stderr(self) -> str:
        return "".join(self.logs.stderr)


@dataclass
class FileInfo:
    """A regular file in a sandbox's workspace (``path`` relative to ``/workspace``)."""

    path: str
    size: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "FileInfo":
        return cls(path=str(data.get("path", "")), size=int(data.get("size", 0)))


@dataclass
class EntryInfo:
    """Anything in a sandbox's workspace, as ``lstat`` sees it: ``type`` is ``"file"``,
    ``"dir"``, ``"symlink"`` or ``"other"`` (a FIFO, socket or device). A link is reported as
    a link, with its target as stored (``symlink_target``), never followed."""

    path: str
    name: str
    type: str
    size: int
    mode: int
    modified: str
    symlink_target: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "EntryInfo":
        target = data.get("symlink_target")
        return cls(
            path=str(data.get("path", "")),
            name=str(data.get("name", "")),
            type=str(data.get("type", "")),
            size=int(data.get("size", 0)),
            mode=int(data.get("mode", 0)),
            modified=str(data.get("modified", "")),
            symlink_target=None if target is None else str(target),
        )


@dataclass
class CommandResult:
    """What ``commands.run`` produced.

    ``exit_code`` is the command's (``None`` when it did not exit by itself, e.g. on timeout);
    ``status`` is ``success`` (exit code 0), ``error``, ``timeout``, ``memory_limit`` or
    ``sandbox_error``.
    """

    stdout: str = ""
    stderr: str = ""
    exit_code: Optional[int] = None
    status: str = "success"
    execution_time_ms: int = 0
    cpu_time_ms: int = 0
    peak_memory_bytes: int = 0
    error_message: Optional[str] = None
    #: The server's warnings, as for :attr:`Execution.warnings`.
    warnings: List[str] = field(default_factory=list)
    #: What the sandbox's egress proxy did while it ran, as :attr:`Execution.network`.
    network: Optional[Dict[str, Any]] = None


@dataclass
class RunResult:
    """The result object of a one-shot run (docs/results.md)."""

    status: str
    exit_code: Optional[int] = None
    signal: Optional[int] = None
    stdout: str = ""
    stderr: str = ""
    stdout_truncated: bool = False
    stderr_truncated: bool = False
    results: List[Result] = field(default_factory=list)
    error: Optional[ExecutionError] = None
    files: List[FileInfo] = field(default_factory=list)
    execution_time_ms: int = 0
    cpu_time_ms: int = 0
    peak_memory_bytes: int = 0
    error_message: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    #: What the sandbox's egress proxy did (``connections``, ``denied``, ``failed``,
    #: ``bytes_up``, ``bytes_down``, ``denials``, ``limit_reached``); ``None`` without a
    #: network policy (docs/network.md).
    network: Optional[Dict[str, Any]] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "RunResult":
        error = data.get("error")
        return cls(
            status=str(data.get("status", "")),
            exit_code=data.get("exit_code"),
            signal=data.get("signal"),
            stdout=data.get("stdout") or "",
            stderr=data.get("stderr") or "",
            stdout_truncated=bool(data.get("stdout_truncated", False)),
            stderr_truncated=bool(data.get("stderr_truncated", False)),
            results=[Result.from_dict(r) for r in data.get("results") or []],
            error=ExecutionError.from_dict(error) if isinstance(error, dict) else None,
            files=[FileInfo.from_dict(f) for f in data.get("files") or []],
            execution_time_ms=int(data.get("execution_time_ms") or 0),
            cpu_time_ms=int(data.get("cpu_time_ms") or 0),
            peak_memory_bytes=int(data.get("peak_memory_bytes") or 0),
            error_message=data.get("error_message"),
            warnings=[str(w) for w in data.get("warnings") or []],
            network=data.get("network"),
        )

    @property
    def logs(self) -> Logs:
        """``stdout``/``stderr`` shaped like :attr:`Execution.logs` (one chunk each)."""
        return Logs(
            stdout=[self.stdout] if self.stdout else [],
            stderr=[self.stderr] if self.stderr else [],
        )

    @property
    def text(self) -> Optional[str]:
        """The text of the main result, if any."""
        for r in self.results:
            if r.is_main_result:
                return r.text
        return None


@dataclass
class SandboxInfo:
    """A session as the server describes it (``state``, ``executions``, … are absent from the
    create answer and therefore ``None`` there)."""

    id: str
    image: str
    language: str
    created_at: Optional[str] = None
    expires_at: Optional[str] = None
    last_used_at: Optional[str] = None
    state: Optional[str] = None
    executions: Optional[int] = None
    death: Optional[str] = None
    warnings: List[str] = field(default_factory=list)
    #: The session's code policy: its key's, narrowed by the one it was created with.
    policy: Optional[Policy] = None
    #: Since when the session is paused (RFC 3339); ``None`` while it runs.
    paused_at: Optional[str] = None
    #: The labels it was created with.
    metadata: Dict[str, str] = field(default_factory=dict)
    #: The limits it runs with (``timeout_s``, ``memory_mb``, ``cpus``, …).
    limits: Dict[str, Any] = field(default_factory=dict)
    #: What the session's egress proxy has done since its kernel started, as
    #: :attr:`RunResult.network`; ``None`` without a network policy.
    network: Optional[Dict[str, Any]] = None
    #: ``kept``, or ``not kept`` for a sandbox paused across a server restart: resumed on its
    #: saved files with a fresh interpreter.
    memory: Optional[str] = None

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SandboxInfo":
        policy = data.get("policy")
        return cls(
            id=str(data["id"]),
            image=str(data.get("image", "")),
            language=str(data.get("language", "")),
            created_at=data.get("created_at"),
            expires_at=data.get("expires_at"),
            last_used_at=data.get("last_used_at"),
            state=data.get("state"),
            executions=data.get("executions"),
            death=data.get("death"),
            warnings=[str(w) for w in data.get("warnings") or []],
            policy=Policy.from_dict(policy) if isinstance(policy, dict) else None,
            paused_at=data.get("paused_at"),
            metadata={str(k): str(v) for k, v in (data.get("metadata") or {}).items()},
            limits=dict(data.get("limits") or {}),
            network=data.get("network"),
            memory=data.get("memory"),
        )


@dataclass
class SandboxMetric:
    """One sample of a session's usage (``Sandbox.metrics()``)."""

    timestamp: str
    timestamp_unix: int
    cpu_count: int
    #: CPU used since the previous sample, in percent of ``cpu_count`` CPUs.
    cpu_used_pct: float
    memory_used_bytes: int
    memory_cache_bytes: int
    memory_limit_bytes: int
    disk_used_bytes: int
    disk_total_bytes: int

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "SandboxMetric":
        return cls(
            timestamp=str(data["timestamp"]),
            timestamp_unix=int(data["timestamp_unix"]),
            cpu_count=int(data["cpu_count"]),
            cpu_used_pct=float(data["cpu_used_pct"]),
            memory_used_bytes=int(data["memory_used_bytes"]),
            memory_cache_bytes=int(data["memory_cache_bytes"]),
            memory_limit_bytes=int(data["memory_limit_bytes"]),
            disk_used_bytes=int(data["disk_used_bytes"]),
            disk_total_bytes=int(data["disk_total_bytes"]),
        )
