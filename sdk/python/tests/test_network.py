"""A session with a network policy, through the SDK (docs/network.md): `pip install --user` of a
small pure-Python package succeeds when the allow-list names only the package index the host's
pip is configured with (read from pip at test time by tests/egress/index.py; no registry host is
written here), and fails with a reason without it. Skipped when the host cannot reach its index.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Callable, List, Tuple

import pytest

import corral
from corral_testing import hello_server

PACKAGE, MODULE = "tomli-w", "tomli_w"
INDEX_SCRIPT = Path(__file__).resolve().parents[3] / "tests" / "egress" / "index.py"


def host_index() -> Tuple[str, List[str]]:
    out = subprocess.run(
        ["/usr/bin/python3", str(INDEX_SCRIPT), PACKAGE], capture_output=True, text=True, check=True
    ).stdout
    index, hosts = None, []
    for line in out.splitlines():
        key, _, value = line.partition(" ")
        if key == "UNREACHABLE":
            pytest.skip(f"the host cannot reach its package index: {value}")
        if key == "INDEX":
            index = value
        elif key == "HOST":
            hosts.append(value)
    assert index and hosts, out
    return index, hosts


def pip_install(index: str) -> str:
    return (
        f"python3 -m pip install --user --no-cache-dir --retries 1 --timeout 20 "
        f"--index-url '{index}' {PACKAGE}"
    )


def test_a_session_installs_from_the_index_its_allow_list_names(
    serve_with: Callable[[str], object],
) -> None:
    index, hosts = host_index()
    # The operator lets the index's names resolve to internal addresses: a mirror on a private
    # network, as on the project's test host.
    config = (
        "[network]\n"
        f"allow = {json.dumps(hosts)}\n"
        f"allow_private = {json.dumps(hosts)}\n"
    )
    with serve_with(config) as url:  # type: ignore[attr-defined]
        env = {"PIP_BREAK_SYSTEM_PACKAGES": "1"}
        with corral.Sandbox(url, image="host", network=hosts) as sb:
            done = sb.commands.run(pip_install(index), env=env, timeout_s=120)
            assert done.exit_code == 0, done
            # The user site did not exist when the interpreter started: add it, as after any
            # `pip install --user` in a running kernel.
            imported = sb.run_code(
                f"import site\nsite.addsitedir(site.getusersitepackages())\n"
                f"import {MODULE}\nprint({MODULE}.__name__)"
            )
            assert imported.error is None, imported
            assert imported.stdout == f"{MODULE}\n"
            info = sb.get_info()
            assert info.network is not None and info.network["connections"] >= 1, info
            assert info.network["denials"] == [], info

        # Without a policy the same install fails: the sandbox has no resolver, no route.
        with corral.Sandbox(url, image="host") as sb:
            failed = sb.commands.run(pip_install(index), env=env, timeout_s=60)
            assert failed.exit_code != 0, failed
            assert sb.get_info().network is None

        # A policy outside the operator's list is refused, naming the host.
        with pytest.raises(corral.NetworkNotAllowedError) as refused:
            corral.Sandbox(url, image="host", network=["example.invalid"])
        assert "example.invalid" in str(refused.value)

        # A one-shot run takes the same parameter and reports what went through.
        ran = corral.run(
            f"import urllib.request\nurllib.request.urlopen('{index}', timeout=20)\nprint('ok')",
            url=url,
            image="host",
            network=hosts,
        )
        assert ran.stdout == "ok\n", ran
        assert ran.network is not None and ran.network["connections"] >= 1, ran


def test_streamed_executions_and_commands_report_their_egress(
    serve_with: Callable[[str], object],
) -> None:
    """`Execution.network` and `CommandResult.network` come from the streamed `end` event:
    the egress of that execution alone. The upstream is a server of the test's on the host's
    loopback, which the operator opts in (no internet needed)."""
    with hello_server() as port:
        fetch = (
            "import os, urllib.request\n"
            "for k in ('NO_PROXY', 'no_proxy'): os.environ.pop(k, None)\n"
            f"print(urllib.request.urlopen('http://localhost:{port}/').read().decode())\n"
        )
        config = f'[network]\nallow = ["localhost:{port}"]\nallow_private = ["localhost"]\n'
        with serve_with(config) as url:  # type: ignore[attr-defined]
            with corral.Sandbox(url, image="host", network=[f"localhost:{port}"]) as sb:
                ran = sb.run_code(f"open('fetch.py', 'w').write({fetch!r})\n{fetch}")
                assert ran.stdout == "hello\n", ran
                assert ran.network is not None and ran.network["connections"] == 1, ran
                assert ran.network["bytes_down"] > 0, ran
                done = sb.commands.run("python3 fetch.py")
                assert done.exit_code == 0 and done.stdout == "hello\n", done
                assert done.network is not None and done.network["connections"] == 1, done
                quiet = sb.run_code("1 + 1")
                assert quiet.network is not None and quiet.network["connections"] == 0, quiet
            with corral.Sandbox(url, image="host") as sb:
                assert sb.run_code("1 + 1").network is None
