"""Three real nodes behind two `corral route` replicas (conftest.py): the Python SDK, the
unmodified E2B SDK and `corral mcp --server` work through either router; creations spread over
the nodes; lists page across nodes; a second tenant reaches nothing of the first; an operator
sees every node's sandboxes, audit lines, keys and gauges through either router; and killing
a node mid-run (SIGKILL; `podman kill` of a node's container) loses its sandboxes (410 / E2B's
"not found", at once) and nothing else (the operator's list names the node unreachable), and the
node is used again once it is back. The kill test runs last in its module and starts the node
again: the cluster is the session's.
"""

from __future__ import annotations

import json
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

from corral_cluster import Cluster, descendants, node_of, podman
from corral_testing import corral_bin

from corral import NotFoundError, Sandbox

CALL_TIMEOUT_S = 120


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def bearer(key: str) -> Dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_creations_spread_and_any_router_reaches_any_sandbox(cluster: Cluster) -> None:
    wait_until_idle(cluster)
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
    # Five creations through one router on idle nodes reach all three (a node still counting
    # an earlier test's sandboxes would be passed over).
    wait_until_idle(cluster)
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


def operator_list(router: str, key: str, limit: int = 1000) -> tuple:
    """Every row of the operator's list through `router`, a page of `limit` at a time, and the
    `nodes` section of the last page."""
    rows: List[Dict[str, Any]] = []
    after = None
    for _ in range(100):
        params = {"limit": str(limit)}
        if after:
            params["after"] = after
        r = httpx.get(f"{router}/v1/operator/sandboxes", params=params, headers=bearer(key), timeout=30)
        assert r.status_code == 200, r.text
        body = r.json()
        assert len(body["sandboxes"]) <= limit
        rows += body["sandboxes"]
        after = body.get("next")
        if not after:
            return rows, {n["name"]: n["status"] for n in body["nodes"]}
    raise AssertionError("the operator's list did not end")


def console_through(router: str, key: str, ids: set, names: set) -> None:
    """Opens the web console through `router` with operator key `key` in a headless Chromium
    (as tests/console does) and checks that it shows the whole cluster: every key's sandboxes
    of every node (`ids`), the router's table of the nodes (`names`) in place of one server's
    pools, the gauges, every node's audit lines, and key creation refused with its reason."""
    import shutil
    import tempfile

    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    chromium = os.environ.get("CORRAL_CHROMIUM", "/usr/bin/chromium")
    chromedriver = os.environ.get("CORRAL_CHROMEDRIVER", "/usr/bin/chromedriver")
    for path in (chromium, chromedriver):
        if not shutil.which(path):
            pytest.fail(f"{path} is missing: run scripts/setup", pytrace=False)
    profile = tempfile.mkdtemp(prefix="corral-chromium-")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--no-first-run",
                "--disable-background-networking", "--window-size=1440,1100",
                f"--user-data-dir={profile}"):
        options.add_argument(arg)
    driver = webdriver.Chrome(options=options, service=Service(executable_path=chromedriver))

    def wait(condition, message: str) -> None:
        WebDriverWait(driver, 30).until(lambda d: condition(), message=message)

    def texts(css: str) -> List[str]:
        # Read in the page at once: the ops page rebuilds its tables every few seconds.
        return driver.execute_script(
            "return [...document.querySelectorAll(arguments[0])].map((e) => e.innerText);", css)

    try:
        driver.get(router + "/#/")
        driver.execute_script(f"sessionStorage.setItem('corral.key', {json.dumps(key)});")
        driver.refresh()
        wait(lambda: "(operator)" in "".join(texts("#who")), "the console did not take the operator key")
        driver.execute_script("const s = document.getElementById('owner-filter'); s.value = '*';"
                              "s.dispatchEvent(new Event('change'));")
        for sandbox in ids:
            wait(lambda: texts(f'#sandboxes tr[data-id="{sandbox}"]'),
                 f"{sandbox} is not in the console's list of every key's sandboxes")
        driver.get(router + "/#/ops")
        wait(lambda: len(texts("#nodes tbody tr")) == len(names), "the ops page shows no table of the nodes")
        rows = texts("#nodes tbody tr")
        assert sorted(r.split()[0] for r in rows) == sorted(names), rows
        assert all(r.split()[1] == "ok" for r in rows), rows
        assert not driver.find_element(By.ID, "pools").is_displayed()
        live = '#gauges [data-metric="corral_sessions_live"]'
        wait(lambda: texts(live), "no gauges")
        assert int(texts(live)[0]) >= len(ids), texts(live)
        wait(lambda: all(i in "".join(texts("#audit")) for i in ids), "the audit log lacks some node's lines")
        driver.find_element(By.ID, "key-name").send_keys("through-the-router")
        driver.find_element(By.ID, "key-form").submit()
        wait(lambda: "corral key add" in "".join(texts("#banner")),
             "making a key here is not refused with its reason")
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


def test_the_operator_sees_the_whole_cluster_through_either_router(cluster: Cluster) -> None:
    names = {n.name for n in cluster.nodes}
    made: List[Sandbox] = []
    other = Sandbox(url=cluster.routers[1], api_key=cluster.other_key)
    try:
        while {node_of(sb.sandbox_id) for sb in made} != names:
            assert len(made) < 9, [sb.sandbox_id for sb in made]
            made.append(Sandbox(url=cluster.routers[len(made) % 2], api_key=cluster.key))
        for sb in made:
            assert sb.run_code("print('audited')").stdout == "audited\n"
        ids = {sb.sandbox_id for sb in made}
        me = httpx.get(f"{cluster.routers[0]}/v1/whoami", headers=bearer(cluster.key)).json()
        assert me["operator"] is False
        op_me = httpx.get(f"{cluster.routers[1]}/v1/whoami", headers=bearer(cluster.operator_key)).json()
        assert op_me["operator"] is True
        for router in cluster.routers:
            # Every node's sandboxes, every key's, each row naming its node, in pages of two.
            rows, nodes = operator_list(router, cluster.operator_key, limit=2)
            listed = [r["id"] for r in rows]
            assert len(listed) == len(set(listed)), listed
            assert ids | {other.sandbox_id} <= set(listed), listed
            assert all(r["node"] == node_of(r["id"]) for r in rows), rows
            assert {r["key_id"] for r in rows if r["id"] in ids} == {me["key_id"]}
            assert nodes == {n: "ok" for n in names}, nodes
            # A plain key is refused through the router exactly as on a node.
            via = httpx.get(f"{router}/v1/operator/sandboxes", headers=bearer(cluster.key))
            direct = httpx.get(f"{cluster.nodes[0].url}/v1/operator/sandboxes", headers=bearer(cluster.key))
            assert via.status_code == direct.status_code == 403
            assert via.json() == direct.json()
            assert httpx.get(f"{router}/v1/keys", headers=bearer(cluster.key)).status_code == 403
            # The audit log of every node, newest first, each line naming its node.
            r = httpx.get(f"{router}/v1/audit", params={"limit": "1000"}, headers=bearer(cluster.operator_key))
            assert r.status_code == 200, r.text
            entries = r.json()["entries"]
            ats = [e["at"] for e in entries]
            assert ats == sorted(ats, reverse=True)
            mine = [e for e in entries if e["session_id"] in ids]
            assert {e["session_id"] for e in mine} == ids
            assert all(e["node"] == node_of(e["session_id"]) for e in mine)
            # ... and the same lines a page of two at a time.
            paged: List[tuple] = []
            before = None
            for _ in range(1000):
                params = {"limit": "2"}
                if before:
                    params["before"] = before
                page = httpx.get(f"{router}/v1/audit", params=params, headers=bearer(cluster.operator_key)).json()
                paged += [(e["node"], e["id"]) for e in page["entries"]]
                before = page.get("next")
                if not before:
                    break
            assert paged[:len(entries)] == [(e["node"], e["id"]) for e in entries]
            # A second tenant sees nothing of the first: not its sandboxes, not its audit lines.
            theirs = httpx.get(f"{router}/v1/sandboxes", headers=bearer(cluster.other_key)).json()["sandboxes"]
            assert not ids & {s["id"] for s in theirs}
            audit = httpx.get(f"{router}/v1/audit", params={"limit": "1000"}, headers=bearer(cluster.other_key))
            assert audit.status_code == 200 and not [e for e in audit.json()["entries"] if e["session_id"] in ids]
            r = httpx.get(f"{router}/v1/audit", params={"key": me["key_id"]}, headers=bearer(cluster.other_key))
            assert r.status_code == 403
            assert httpx.get(f"{router}/v1/operator/sandboxes", headers=bearer(cluster.other_key)).status_code == 403
            # The keys of every node, the same everywhere; none is made through a router.
            keys = httpx.get(f"{router}/v1/keys", headers=bearer(cluster.operator_key)).json()
            assert len(keys["keys"]) >= 3 and not [k for k in keys["keys"] if "differs_on" in k], keys
            r = httpx.post(f"{router}/v1/keys", json={"name": "x"}, headers=bearer(cluster.operator_key))
            assert r.status_code == 501 and r.json()["error"]["code"] == "keys_on_nodes"
            # The ops page's gauges: every node's, labelled; the router's health names them.
            metrics = httpx.get(f"{router}/metrics", headers=bearer(cluster.operator_key))
            assert metrics.status_code == 200
            for name in names:
                assert f'corral_router_node_up{{node="{name}"}} 1' in metrics.text
                assert f'corral_sessions_live{{node="{name}"}}' in metrics.text
            health = httpx.get(f"{router}/healthz").json()
            assert {n["name"]: n["status"] for n in health["nodes"]} == {n: "ok" for n in names}
        # The console, opened through a router, shows the same.
        console_through(cluster.routers[0], cluster.operator_key, ids, names)
        # Restart, pause, resume and delete reach the sandbox's node through a router.
        sb = made[0]
        sb.run_code("kept = 1")
        base = f"{cluster.routers[1]}/v1/sandboxes/{sb.sandbox_id}"
        r = httpx.post(f"{base}/restart", headers=bearer(cluster.key), timeout=CALL_TIMEOUT_S)
        assert r.status_code in (200, 204), r.text
        lost = sb.run_code("kept")
        assert lost.error is not None and lost.error.name == "NameError", lost
        r = httpx.post(f"{base}/pause", headers=bearer(cluster.key), timeout=CALL_TIMEOUT_S)
        if r.status_code == 409 and r.json()["error"]["code"] == "pause_unsupported":
            pass  # rootless without a cgroup: refused by the node, as documented
        else:
            assert r.status_code == 200 and r.json()["state"] == "paused", r.text
            r = httpx.post(f"{base}/resume", headers=bearer(cluster.key), timeout=CALL_TIMEOUT_S)
            assert r.status_code == 200 and r.json()["state"] == "running", r.text
        assert httpx.delete(base, headers=bearer(cluster.key)).status_code in (200, 204)
        r = httpx.get(base, headers=bearer(cluster.key))
        assert r.status_code == 404 or r.json()["state"] == "dead", r.text
    finally:
        for sb in made + [other]:
            sb.kill()


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
        # The operator's list says the node does not answer, and still lists the others.
        for router in cluster.routers:
            rows, nodes = operator_list(router, cluster.operator_key)
            assert nodes[victim.name] == "unreachable", nodes
            assert all(status == "ok" for name, status in nodes.items() if name != victim.name), nodes
            listed = {r["id"] for r in rows}
            assert {sb.sandbox_id for sb in kept} <= listed
            assert not listed & {sb.sandbox_id for sb in doomed}
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
