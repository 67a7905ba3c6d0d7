"""DNS discovery for real: `corral route --nodes-dns NAME:PORT` in front of the scale suite's
three nodes (127.0.0.2, .3 and .4 on one port, as a headless Service's pods), with a resolver
that answers NAME with the addresses of the nodes listed, as the Service's DNS answers with its
ready pods. No cluster and no DNS server: the router runs in a mount namespace of its own in
which a directory of the test is bound over /etc; its `hosts` lists NAME once per node (the
static binary's resolver, musl's, returns every line that names it, and reads the file at every
lookup) and the test rewrites it (a new file renamed over the old, so that no lookup reads half
of one) to take nodes out of DNS and put them back.

What the router does (docs/scale-out.md): a node that is not in DNS takes no new sandbox; one
that leaves DNS keeps serving its sandboxes at its last address while it answers there (a pod
that is not ready, or is terminating, is still running them); a node that comes into DNS is
used; a lookup that fails keeps the last answer."""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path
from typing import Iterator, List

import httpx
import pytest

from corral_cluster import Cluster, Node, node_of
from corral_testing import corral_bin, free_port, stop

from corral import Sandbox

NAME = "corral-nodes.scale.invalid"


class DnsRouter:
    def __init__(self, cluster: Cluster, etc: Path) -> None:
        self.cluster = cluster
        self.etc = etc
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = cluster.tmp / "dns-router.log"
        self.proc: subprocess.Popen

    def publish(self, nodes: List[Node]) -> None:
        """NAME resolves to the addresses of `nodes`, and to nothing when there are none."""
        new = self.etc / "hosts.new"
        new.write_text("".join(f"{n.host} {NAME}\n" for n in nodes))
        new.chmod(0o644)
        os.replace(new, self.etc / "hosts")

    def wait_until(self, up: int, listed: int) -> None:
        self.cluster.wait_until_routers_see(up, timeout=30, routers=[self.url], listed=listed)

    def key(self) -> str:
        return self.cluster.key


@pytest.fixture(scope="module")
def dns_router(cluster: Cluster) -> Iterator[DnsRouter]:
    etc = cluster.tmp / "dns-router-etc"
    etc.mkdir()
    etc.chmod(0o755)
    # When NAME is not in hosts, musl asks the name servers of resolv.conf: one that answers
    # nothing here (or NXDOMAIN), once, for a second.
    (etc / "resolv.conf").write_text("nameserver 127.0.0.1\noptions timeout:1 attempts:1\n")
    router = DnsRouter(cluster, etc)
    # The third node is not in DNS yet: this router never sees it until it is.
    router.publish(cluster.nodes[:2])
    # A mount namespace of its own (and a user namespace to make it in, without root): the
    # bind over /etc is the router's alone.
    unshare = ["unshare", "--mount"] if os.geteuid() == 0 else ["unshare", "--user", "--map-root-user", "--mount"]
    port = cluster.nodes[0].port
    assert all(n.port == port for n in cluster.nodes)
    argv = [*unshare, "sh", "-c", 'mount --bind "$0" /etc && exec "$@"', str(etc),
            str(corral_bin()), "route", "--listen", f"127.0.0.1:{router.port}", "--nodes-dns", f"{NAME}:{port}",
            "--probe-interval", "250ms", "--connect-timeout", "1s"]
    with open(router.log, "wb") as log:
        router.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
    cluster.logs.append(router.log)
    try:
        router.wait_until(up=2, listed=2)
        yield router
    finally:
        stop(router.proc)
        cluster.logs.remove(router.log)


def make(router: DnsRouter, count: int) -> List[Sandbox]:
    return [Sandbox(url=router.url, api_key=router.key()) for _ in range(count)]


def test_nodes_come_and_go_with_their_dns_records(cluster: Cluster, dns_router: DnsRouter) -> None:
    a, b, c = cluster.nodes
    made: List[Sandbox] = []
    try:
        # Only a and b in DNS (since the router started): c runs, and this router never
        # uses it.
        dns_router.wait_until(up=2, listed=2)
        first = make(dns_router, 4)
        made += first
        assert {node_of(sb.sandbox_id) for sb in first} == {a.name, b.name}

        # c comes into DNS: it is used (the least loaded, it gets the next ones).
        dns_router.publish([a, b, c])
        dns_router.wait_until(up=3, listed=3)
        added = make(dns_router, 3)
        made += added
        assert c.name in {node_of(sb.sandbox_id) for sb in added}

        # a leaves DNS: its sandboxes are still served, with their state, and listed; no new
        # sandbox goes to it.
        on_a = [sb for sb in made if node_of(sb.sandbox_id) == a.name]
        assert on_a
        for i, sb in enumerate(on_a):
            sb.run_code(f"kept = {i}")
        dns_router.publish([b, c])
        dns_router.wait_until(up=3, listed=2)
        for i, sb in enumerate(on_a):
            same = Sandbox.connect(sb.sandbox_id, url=dns_router.url, api_key=cluster.key)
            try:
                assert same.run_code("kept * 10").text == str(i * 10)
            finally:
                same.close()
        listed = httpx.get(f"{dns_router.url}/v1/sandboxes", params={"limit": 100},
                           headers={"Authorization": f"Bearer {cluster.key}"}, timeout=30)
        assert listed.status_code == 200, listed.text
        ids = {s["id"] for s in listed.json()["sandboxes"]}
        assert {sb.sandbox_id for sb in on_a} <= ids
        later = make(dns_router, 6)
        made += later
        assert a.name not in {node_of(sb.sandbox_id) for sb in later}
    finally:
        dns_router.publish(cluster.nodes)
        for sb in made:
            sb.kill()
    dns_router.wait_until(up=3, listed=3)


def test_a_failed_lookup_keeps_the_last_answer(cluster: Cluster, dns_router: DnsRouter) -> None:
    dns_router.wait_until(up=3, listed=3)
    try:
        # NAME vanishes from hosts and no name server answers: the lookup fails, and the router
        # keeps the nodes of its last answer, which keep taking new sandboxes.
        dns_router.publish([])
        deadline = time.monotonic() + 30
        said = f"resolving {NAME}:{cluster.nodes[0].port}"
        while time.monotonic() < deadline and said not in dns_router.log.read_text(errors="replace"):
            time.sleep(0.2)
        log = dns_router.log.read_text(errors="replace")
        assert said in log and "using its last answer (3 addresses)" in log, log[-2000:]
        health = httpx.get(f"{dns_router.url}/healthz", timeout=10).json()
        assert health["nodes_up"] == 3 and health["nodes_listed"] == 3, health
        made = make(dns_router, 3)
        try:
            assert len({node_of(sb.sandbox_id) for sb in made}) >= 2
        finally:
            for sb in made:
                sb.kill()
    finally:
        dns_router.publish(cluster.nodes)
