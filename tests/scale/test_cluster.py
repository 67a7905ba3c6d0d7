"""Three real nodes behind two `corral route` replicas (conftest.py): the Python SDK, the
unmodified E2B SDK and `corral mcp --server` work through either router; creations spread over
the nodes; lists page across nodes; a second tenant reaches nothing of the first; and killing
a node mid-run (SIGKILL; `podman kill` of a node's container) loses its sandboxes (410 / E2B's
"not found", at once) and nothing else, and the node is used again once it is back. The kill
test runs last in its module and starts the node again: the cluster is the session's.
"""

from __future__ import annotations

import os
import secrets
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any, Dict, List

import anyio
import httpx
import pytest

from corral_cluster import Cluster, corral_bin, descendants, node_of, podman

from corral import NotFoundError, Sandbox

CALL_TIMEOUT_S = 120


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def bearer(key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_creations_spread_and_any_router_reaches_any_sandbox(cluster: Cluster) -> None:
    made = [Sandbox(url=cluster.routers[i % 2], api_key=cluster.key) for i in range(6)]
    try:
        # Least-loaded placement: six new sandboxes on three idle nodes reach all three; two
        # routers that place independently between probes may put one more on a node.
        spread = Counter(node_of(sb.sandbox_id) for sb in made)
        assert set(spread) == {n.name for n in cluster.nodes} and max(spread.values()) <= 3, spread
        # What the routers place by: each node's name and load, on its /healthz.
        for node in cluster.nodes:
            health = httpx.get(f"{node.url}/healthz").json()
            assert health["node"] == node.name
            assert health["sessions_live"] >= spread[node.name]
            assert health["max_sessions"] == 150  # the ConfigMap's
        for i, sb in enumerate(made):
            assert sb.run_code(f"x = {i}\nprint('set')").stdout == "set\n"
        payload = secrets.token_bytes(3 << 20)
        for i, sb in enumerate(made):
            # The other router reaches the same sandbox: its state, its files, its streams.
            other = Sandbox.connect(sb.sandbox_id, url=cluster.routers[(i + 1) % 2], api_key=cluster.key)
            try:
                assert other.run_code("x * 10").text == str(i * 10)
                other.files.write("blob.bin", payload)
                assert sb.files.read("blob.bin", format="bytes") == payload
                chunks: List[str] = []
                streamed = other.run_code(
                    "import time\nfor n in range(3):\n    print(n, flush=True)\n    time.sleep(0.2)",
                    on_stdout=chunks.append,
                )
                assert streamed.stdout == "0\n1\n2\n" and len(chunks) >= 2
                assert other.commands.run("echo $((6*7))").stdout == "42\n"
            finally:
                other.close()
    finally:
        for sb in made:
            sb.kill()


def test_lists_page_across_nodes_through_either_router(cluster: Cluster) -> None:
    tag = secrets.token_hex(4)
    made = [Sandbox(url=cluster.routers[0], api_key=cluster.key, metadata={"suite": tag}) for _ in range(5)]
    try:
        expected = {sb.sandbox_id for sb in made}
        assert len({node_of(i) for i in expected}) == 3
        # Native pages of two, alternating routers: every sandbox once.
        seen: List[str] = []
        after = None
        for page in range(10):
            params = {"limit": "2", "metadata.suite": tag}
            if after:
                params["after"] = after
            r = httpx.get(f"{cluster.routers[page % 2]}/v1/sandboxes", params=params, headers=bearer(cluster.key))
            assert r.status_code == 200, r.text
            body = r.json()
            assert len(body["sandboxes"]) <= 2
            seen += [s["id"] for s in body["sandboxes"]]
            after = body.get("next")
            if not after:
                break
        assert sorted(seen) == sorted(expected)
        # The SDK follows the pages itself.
        listed = Sandbox.list(url=cluster.routers[1], api_key=cluster.key, metadata={"suite": tag})
        assert sorted(s.id for s in listed) == sorted(expected)
        # E2B's list, by `nextToken` and `x-next-token`.
        e2b_seen: List[str] = []
        token = None
        for page in range(10):
            params = {"limit": "2", "metadata": f"suite={tag}"}
            if token:
                params["nextToken"] = token
            r = httpx.get(f"{cluster.routers[page % 2]}/v2/sandboxes", params=params,
                          headers={"X-API-KEY": cluster.key})
            assert r.status_code == 200, r.text
            e2b_seen += [s["sandboxID"] for s in r.json()]
            token = r.headers.get("x-next-token")
            if not token:
                break
        assert sorted(e2b_seen) == sorted(expected)
        # A cursor no router made is refused, not taken for the start.
        r = httpx.get(f"{cluster.routers[0]}/v1/sandboxes", params={"after": "garbage"}, headers=bearer(cluster.key))
        assert r.status_code == 400 and r.json()["error"]["code"] == "bad_request"
    finally:
        for sb in made:
            sb.kill()


def test_a_second_tenant_reaches_nothing_of_the_first(cluster: Cluster) -> None:
    sb = Sandbox(url=cluster.routers[0], api_key=cluster.key)
    try:
        sb.files.write("secret.txt", "tenant a")
        for router in cluster.routers:
            base = f"{router}/v1/sandboxes/{sb.sandbox_id}"
            other = bearer(cluster.other_key)
            assert httpx.get(base, headers=other).status_code == 404
            assert httpx.get(f"{base}/files/secret.txt", headers=other).status_code == 404
            assert httpx.post(f"{base}/execute", json={"code": "1"}, headers=other).status_code == 404
            assert httpx.delete(base, headers=other).status_code == 404
            assert httpx.get(f"{router}/sandboxes/{sb.sandbox_id}", headers={"X-API-KEY": cluster.other_key}).status_code == 404
            listed = httpx.get(f"{router}/v1/sandboxes", headers=other).json()["sandboxes"]
            assert sb.sandbox_id not in [s["id"] for s in listed]
            # The sandbox plane without the sandbox's token: E2B's "not found".
            r = httpx.post(f"{router}/execute", json={"code": "1"}, headers={"E2b-Sandbox-Id": sb.sandbox_id})
            assert r.status_code == 502
            # Keys are checked by the nodes, and the router passes their answer on.
            assert httpx.get(base, headers=bearer("crl_not_a_key")).status_code == 401
        # Still there, untouched.
        assert sb.files.read("secret.txt") == "tenant a"
    finally:
        sb.kill()


def wait_until_idle(cluster: Cluster, timeout: float = 30) -> None:
    """Until every node is `ok` with no live sandbox (those of the tests before are gone), and
    the routers have read that: they probe each node's load once a second, and place by what
    they read last (a node still counting a killed sandbox, or replacing a zygote, is passed
    over)."""
    deadline = time.monotonic() + timeout
    while True:
        seen = [httpx.get(f"{node.url}/healthz").json() for node in cluster.nodes]
        if all(h["status"] == "ok" and h["sessions_live"] == 0 for h in seen):
            break
        assert time.monotonic() < deadline, f"the nodes did not become idle: {seen}"
        time.sleep(0.2)
    time.sleep(1.5)


def test_the_e2b_sdk_through_the_routers(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    # The control plane through one router, the sandbox plane through the other.
    monkeypatch.setenv("E2B_API_URL", cluster.routers[0])
    monkeypatch.setenv("E2B_SANDBOX_URL", cluster.routers[1])
    monkeypatch.setenv("E2B_API_KEY", cluster.key)
    monkeypatch.setenv("E2B_DEBUG", "false")
    monkeypatch.delenv("E2B_DOMAIN", raising=False)
    from e2b_code_interpreter import Sandbox as E2bSandbox

    # Three creations through one router on three idle nodes: one on each, as that router
    # counts what it placed until its next probe.
    wait_until_idle(cluster)
    made = [E2bSandbox.create() for _ in range(3)]
    try:
        assert {node_of(s.sandbox_id) for s in made} == {n.name for n in cluster.nodes}
        for i, sbx in enumerate(made):
            execution = sbx.run_code(f"{i} + 40")
            assert execution.text == str(i + 40), execution
            sbx.files.write("/home/user/hello.txt", f"hello {i}")
            assert sbx.files.read("/home/user/hello.txt") == f"hello {i}"
            assert sbx.commands.run("cat hello.txt").stdout == f"hello {i}"
            again = E2bSandbox.connect(sbx.sandbox_id)
            assert "".join(again.run_code("print('again')").logs.stdout) == "again\n"
    finally:
        for sbx in made:
            sbx.kill()
    assert not made[0].is_running()


@pytest.mark.anyio
async def test_the_mcp_server_through_a_router(cluster: Cluster) -> None:
    from mcp import Client, StdioServerParameters

    env = {k: v for k, v in os.environ.items() if k != "CORRAL_API_KEY"}
    args = ["mcp", "--server", cluster.routers[1], "--api-key", cluster.key]
    async with Client(StdioServerParameters(command=str(corral_bin()), args=args, env=env)) as client:
        with anyio.fail_after(CALL_TIMEOUT_S):
            made = await client.call_tool("create_session", {})
            assert not made.is_error, made
            session = made.structured_content["id"]
            assert node_of(session) in {n.name for n in cluster.nodes}
            first = await client.call_tool("run_code", {"code": "y = 21", "session_id": session})
            assert not first.is_error, first
            second = await client.call_tool("run_code", {"code": "y * 2", "session_id": session})
            assert second.structured_content["results"][0]["text"] == "42"
            closed = await client.call_tool("close_session", {"session_id": session})
            assert not closed.is_error, closed


def test_killing_a_node_loses_only_its_sandboxes(cluster: Cluster) -> None:
    made = [Sandbox(url=cluster.routers[i % 2], api_key=cluster.key) for i in range(6)]
    victim = cluster.node(node_of(made[0].sandbox_id))
    doomed = [sb for sb in made if node_of(sb.sandbox_id) == victim.name]
    kept = [sb for sb in made if node_of(sb.sandbox_id) != victim.name]
    assert doomed and kept
    for sb in kept:
        sb.run_code("n = 0")
    stop = threading.Event()
    done: Counter = Counter()
    failures: List[str] = []

    def hammer(sb: Sandbox) -> None:
        # Every execution of a sandbox on a surviving node, before, during and after the
        # kill, through both routers, must succeed.
        for i in range(10_000):
            if stop.is_set():
                return
            url = cluster.routers[i % 2]
            try:
                same = Sandbox.connect(sb.sandbox_id, url=url, api_key=cluster.key)
                try:
                    ran = same.run_code("n += 1\nn")
                finally:
                    same.close()  # only the connection: the sandbox stays
                if ran.status != "success":
                    failures.append(f"{sb.sandbox_id}: {ran.status} {ran.error}")
                done[sb.sandbox_id] += 1
            except Exception as e:  # noqa: BLE001 - any failure is the finding
                failures.append(f"{sb.sandbox_id} via {url}: {e!r}")

    workers = [threading.Thread(target=hammer, args=(sb,)) for sb in kept]
    for w in workers:
        w.start()
    try:
        time.sleep(1.5)
        below = descendants(victim.main_pid())
        assert below, "the node runs its sandboxes as its children"
        victim.kill()
        killed_at = time.monotonic()
        # Its sandboxes are gone, and say so at once through both routers.
        for router in cluster.routers:
            for sb in doomed:
                r = httpx.post(f"{router}/v1/sandboxes/{sb.sandbox_id}/execute", json={"code": "1"},
                               headers=bearer(cluster.key), timeout=10)
                assert r.status_code == 410, r.text
                assert r.json()["error"]["code"] == "sandbox_gone"
                assert victim.name in r.json()["error"]["message"]
                r = httpx.get(f"{router}/sandboxes/{sb.sandbox_id}", headers={"X-API-KEY": cluster.key}, timeout=10)
                assert r.status_code == 404, r.text
        assert time.monotonic() - killed_at < 5
        with pytest.raises(NotFoundError):
            Sandbox.connect(doomed[0].sandbox_id, url=cluster.routers[1], api_key=cluster.key).run_code("1")
        # New sandboxes go to the nodes that are left, and none is refused.
        fresh = [Sandbox(url=cluster.routers[i % 2], api_key=cluster.key) for i in range(4)]
        try:
            assert victim.name not in {node_of(sb.sandbox_id) for sb in fresh}
        finally:
            for sb in fresh:
                sb.kill()
        time.sleep(1.5)
    finally:
        stop.set()
        for w in workers:
            w.join(timeout=60)
    assert not failures, failures[:5]
    assert all(done[sb.sandbox_id] >= 3 for sb in kept), done
    # Nothing of the dead node is left on the host: its sandboxes ended with it.
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and any(Path(f"/proc/{pid}").exists() for pid in below):
        time.sleep(0.2)
    left = [pid for pid in below if Path(f"/proc/{pid}").exists()]
    assert not left, f"processes of the killed node still run: {left}"
    if victim.containers is not None:
        # Its container is removed (`--rm`), with its cgroup and the sandboxes' below it.
        while time.monotonic() < deadline and podman("container", "exists", victim.container).returncode == 0:
            time.sleep(0.2)
        assert podman("container", "exists", victim.container).returncode == 1, "the killed container is left"
        for parent in Path("/sys/fs/cgroup").glob(f"*/{victim.containers.prefix}"):
            containers = [p.name for p in parent.glob("libpod-*")]
            assert len(containers) == len(cluster.nodes) - 1, f"{parent}: {containers}"
    # Back again (a fresh process: no sandboxes), it takes new sandboxes; the old ids are not
    # found, as on any node that does not hold them.
    victim.start()
    cluster.wait_until_routers_see(len(cluster.nodes))
    back = [Sandbox(url=cluster.routers[i % 2], api_key=cluster.key) for i in range(3)]
    try:
        assert victim.name in {node_of(sb.sandbox_id) for sb in back}
        r = httpx.get(f"{cluster.routers[0]}/v1/sandboxes/{doomed[0].sandbox_id}", headers=bearer(cluster.key))
        assert r.status_code == 404
    finally:
        for sb in back + kept:
            sb.kill()
