"""The async client mirrors the sync one method for method (no server needed): every public
method, property and sub-client of a sync class has its async counterpart, with the same
parameters, as a coroutine where the sync one does I/O."""

from __future__ import annotations

import inspect
from typing import Any, Dict, List, Tuple

import pytest

import corral
from corral import (
    AsyncCommands,
    AsyncFiles,
    AsyncProcessHandle,
    AsyncProcesses,
    AsyncSandbox,
    Commands,
    Files,
    ProcessHandle,
    Processes,
    Sandbox,
)

#: Each sync class and its async twin.
TWINS: List[Tuple[type, type]] = [
    (Sandbox, AsyncSandbox),
    (Files, AsyncFiles),
    (Commands, AsyncCommands),
    (Processes, AsyncProcesses),
    (ProcessHandle, AsyncProcessHandle),
]
#: Sync protocol methods and what the async class has instead.
PROTOCOLS: Dict[str, str] = {
    "__enter__": "__aenter__",
    "__exit__": "__aexit__",
    "__iter__": "__aiter__",
}


def public_members(cls: type) -> Dict[str, Any]:
    members = {
        name: inspect.getattr_static(cls, name)
        for name in dir(cls)
        if not name.startswith("_") or name in PROTOCOLS
    }
    # Attributes a sync instance gets in its constructor, declared on the class.
    for name in getattr(cls, "__annotations__", {}):
        if not name.startswith("_"):
            members.setdefault(name, None)
    return {n: m for n, m in members.items() if n in PROTOCOLS or not n.startswith("_")}


def function_of(member: Any) -> Any:
    if isinstance(member, (staticmethod, classmethod)):
        return member.__func__
    return member


def parameters(fn: Any) -> List[Tuple[str, Any, Any]]:
    return [
        (p.name, p.kind, p.default)
        for p in inspect.signature(fn).parameters.values()
        if p.name not in ("self", "cls")
    ]


@pytest.mark.parametrize("sync_cls, async_cls", TWINS, ids=[a.__name__ for _, a in TWINS])
def test_every_sync_method_has_an_async_counterpart(sync_cls: type, async_cls: type) -> None:
    missing, differing = [], []
    for name, member in public_members(sync_cls).items():
        twin_name = PROTOCOLS.get(name, name)
        if not hasattr(async_cls, twin_name) and twin_name not in getattr(
            async_cls, "__annotations__", {}
        ):
            missing.append(name)
            continue
        fn = function_of(member)
        if not inspect.isfunction(fn) or name in PROTOCOLS:
            continue
        twin = function_of(inspect.getattr_static(async_cls, twin_name))
        if not inspect.iscoroutinefunction(twin) and not inspect.isasyncgenfunction(twin):
            differing.append(f"{name} is not a coroutine function")
        elif parameters(fn) != parameters(twin):
            differing.append(f"{name}{inspect.signature(fn)} != {inspect.signature(twin)}")
    assert not missing, f"{async_cls.__name__} lacks {missing}"
    assert not differing, f"{async_cls.__name__}: {differing}"


def test_sub_clients_are_the_async_twins() -> None:
    sync = Sandbox.__new__(Sandbox)
    sync._init(None)  # type: ignore[arg-type]  # no I/O: only builds the sub-clients
    twin = AsyncSandbox("http://127.0.0.1:9")  # the constructor does no I/O
    twins = dict(TWINS)
    sync_subs = {k: type(v) for k, v in vars(sync).items() if not k.startswith("_")}
    async_subs = {k: type(v) for k, v in vars(twin).items() if not k.startswith("_")}
    assert sync_subs, "Sandbox has no sub-clients?"
    assert {k: twins[v] for k, v in sync_subs.items()} == async_subs


def test_one_shot_run_has_an_async_twin() -> None:
    assert inspect.iscoroutinefunction(corral.async_run)
    assert parameters(corral.run) == parameters(corral.async_run)


def test_the_check_sees_a_missing_method() -> None:
    """The parity check itself can fail: a sync method without a twin is reported."""

    class Extra(Files):
        def chmod(self, path: str) -> None: ...

    with pytest.raises(AssertionError, match="chmod"):
        test_every_sync_method_has_an_async_counterpart(Extra, AsyncFiles)
