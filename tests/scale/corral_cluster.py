"""Helpers of the scale suite (a module of its own, not conftest.py: several suites run in one
pytest process, and each has a conftest). A Corral cluster on one machine: three `corral serve`
nodes (each its own address, 127.0.0.2, .3 and .4, on one port, its own database and node name)
and two `corral route` replicas in front of them, as docs/scale-out.md deploys it on
Kubernetes. Two API keys and an operator key are made on the first node and added to the others
with `corral key add`, as the cluster's Secret would be.

The nodes are containers of the node image (scripts/node-image, loaded into podman from its
OCI layout, no registry) or processes of the binary; which one, $CORRAL_SCALE_NODES says
(`containers` or `processes`). Unset, they are containers when the suite runs as root with
podman, runc and umoci installed (scripts/setup installs them), processes otherwise, and the
suite says so loudly (on the terminal and as a warning). Containers that cannot run fail the
suite: there is no fallback once containers are chosen (.ci/run sets `containers`).

The binary is the one tests/corral_testing finds ($CORRAL_BIN, else the repository's); every process and container is stopped at
the end, and the containers' cgroups and mounts are checked gone.
"""

from __future__ import annotations

import os
import re
import resource
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

from corral_testing import REPO, add_key, corral_bin, create_key, free_port, health, stop
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
BUILD_TIMEOUT_S = 900
NODES = 3
ROUTERS = 2
# Every node on an address of its own and one port, as pods behind a headless Service.
NODE_HOSTS = [f"127.0.0.{2 + i}" for i in range(NODES)]
# podman (4.3) runs a container's conmon with RLIMIT_NPROC 32768 and asks for more in the
# container (nofile 1048576, nproc 4194304), which root without CAP_SYS_RESOURCE (this test
# machine) may not set: the containers get these.
CONTAINER_NPROC = 32768


def node_config(tmp: Path) -> Path:
    """The nodes' corral.toml from deploy/kubernetes/configmap.yaml (the literal block under
    `corral.toml: |`), so that the suite runs the settings the manifests deploy; the command
    line overrides `listen`, `db` and `pool_size` (and $CORRAL_DATA_DIR, `data_dir`)."""
    lines = (REPO / "deploy" / "kubernetes" / "configmap.yaml").read_text().splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip() == "corral.toml: |") + 1
    body = []
    for line in lines[start:]:
        if line.strip() and not line.startswith("    "):
            break
        body.append(line[4:])
    path = tmp / "corral.toml"
    path.write_text("\n".join(body) + "\n")
    return path


def free_port_on(hosts: List[str]) -> int:
    """A port free on every one of `hosts`."""
    for _ in range(100):
        port = free_port()
        try:
            for host in hosts:
                with socket.socket() as s:
                    s.bind((host, port))
            return port
        except OSError:
            continue
    pytest.fail(f"no port free on all of {hosts}", pytrace=False)


class ProcessNodes(UserWarning):
    """The scale suite ran its nodes as processes, not containers of the node image."""


def node_mode() -> str:
    """`containers` or `processes` (the module docstring has the rule)."""
    chosen = os.environ.get("CORRAL_SCALE_NODES", "")
    if chosen in ("containers", "processes"):
        return chosen
    if chosen:
        pytest.fail(f"CORRAL_SCALE_NODES={chosen!r}: say containers or processes", pytrace=False)
    missing = [tool for tool in ("podman", "runc", "umoci") if shutil.which(tool) is None]
    if os.geteuid() == 0 and not missing:
        return "containers"
    why = "not root" if os.geteuid() != 0 else f"{', '.join(missing)} missing"
    message = (f"THE SCALE SUITE'S NODES ARE PROCESSES, NOT CONTAINERS OF THE NODE IMAGE ({why}; "
               "scripts/setup installs podman and runc; CORRAL_SCALE_NODES=containers insists)")
    sys.__stderr__.write(f"\n*** {message} ***\n")
    warnings.warn(message, ProcessNodes)
    return "processes"


@dataclass
class NodeImage:
    """The node image as scripts/node-image built it (`layout`, `tag`, `digest`, `size` as it
    printed them), from `binary`, a copy of the corral binary in `work`."""
    fields: Dict[str, str]
    binary: Path
    work: Path
    # Its id in podman's store, once loaded.
    podman_id: Optional[str] = None


def build_node_image(binary: Path, out: Path) -> Dict[str, str]:
    done = subprocess.run([str(REPO / "scripts" / "node-image"), "--binary", str(binary), "--out", str(out)],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    fields = dict(re.findall(r"^(layout|tag|digest|size)\s+(.*)$", done.stdout, re.M))
    assert set(fields) == {"layout", "tag", "digest", "size"}, done.stdout
    return fields


@pytest.fixture(scope="session")
def node_image():
    """The node image, built once a session (by tests/scale/test_node_image.py, which builds it
    again to compare, and for the cluster's containers), removed at the end with its copy in
    podman's store. Outside pytest's private temporary directory: a sandbox's unprivileged user
    must be able to enter the image's store, as it can in /var/lib/corral of a node."""
    if os.geteuid() != 0:
        pytest.fail("the node image needs root (umoci unpack keeps the image's owners)", pytrace=False)
    if shutil.which("umoci") is None:
        pytest.fail("umoci is missing: scripts/setup installs it", pytrace=False)
    # podman names an image pulled from a layout after its path, which must then be a valid
    # reference (mkdtemp's names may hold `_` where a reference may not).
    work = Path("/var/tmp") / f"corral-node-image-{os.getpid()}-{secrets.token_hex(4)}"
    work.mkdir(mode=0o755)
    image = None
    try:
        work.chmod(0o755)
        # Every build from one copy of the binary: a build elsewhere may replace the original.
        binary = work / "corral"
        shutil.copy2(corral_bin(), binary)
        image = NodeImage(build_node_image(binary, work / "a"), binary, work)
        yield image
    finally:
        if image is not None and image.podman_id is not None:
            subprocess.run(["podman", "rmi", "--force", image.podman_id], capture_output=True, timeout=120)
        shutil.rmtree(work)


def podman(*args: str, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run(["podman", "--runtime", "runc", *args], capture_output=True, text=True,
                          timeout=timeout)


def load_into_podman(image: NodeImage) -> str:
    """The node image in podman's store, from its OCI layout (no registry): its id."""
    if image.podman_id is None:
        tag = image.fields["tag"].split(":", 1)[1]
        pulled = podman("pull", "--quiet", f"oci:{image.fields['layout']}:{tag}", timeout=BUILD_TIMEOUT_S)
        assert pulled.returncode == 0, pulled.stderr
        image.podman_id = pulled.stdout.strip().splitlines()[-1]
    return image.podman_id


@dataclass
class Containers:
    """How the nodes run as containers: the image, and what every container shares (a cgroup
    parent of this run's own, removed at the end; the suite's temporary directory, at the same
    path, for the configuration and databases)."""
    image: str
    prefix: str
    tmp: Path
    # The ids and root filesystem mounts of every container seen (remember()).
    seen: List[str] = field(default_factory=list)

    @property
    def cgroup_parent(self) -> str:
        return f"/{self.prefix}"

    def argv(self, name: str, command: List[str]) -> List[str]:
        nofile = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
        nproc = min(resource.getrlimit(resource.RLIMIT_NPROC)[1], CONTAINER_NPROC)
        # The pod's settings (docs/scale-out.md, "Pod security"): privileged, which gives the
        # cgroup tree and every namespace; the host's network stands in for the pod network.
        return ["podman", "--runtime", "runc", "run", "--rm", "--name", f"{self.prefix}-{name}",
                "--cgroup-parent", self.cgroup_parent, "--privileged", "--network", "host",
                "--ulimit", f"nofile={nofile}:{nofile}", "--ulimit", f"nproc={nproc}:{nproc}",
                "--volume", f"{self.tmp}:{self.tmp}", self.image, *command]

    def ids(self) -> List[str]:
        listed = podman("ps", "--all", "--quiet", "--no-trunc", "--filter", f"name=^{self.prefix}-")
        assert listed.returncode == 0, listed.stderr
        return listed.stdout.split()

    def remember(self) -> None:
        """Notes the id and root filesystem mount of every container of this run now running,
        to check at the end that none is left mounted."""
        for container in self.ids():
            seen = podman("inspect", "--format", "{{.Id}} {{.GraphDriver.Data.MergedDir}}", container)
            if seen.returncode == 0:
                self.seen.extend(w for w in seen.stdout.split() if w not in self.seen)

    def remove_cgroups(self) -> List[str]:
        """Removes this run's cgroup parent (podman leaves it and its `conmon` child behind)
        in every hierarchy; what could not be removed (still in use) is returned."""
        left = []
        for hierarchy in Path("/sys/fs/cgroup").iterdir():
            parent = hierarchy / self.prefix
            if not parent.is_dir():
                continue
            for d in sorted((p for p in parent.rglob("*") if p.is_dir()), key=lambda p: -len(p.parts)) + [parent]:
                try:
                    d.rmdir()
                except OSError:
                    left.append(str(d))
        return left


def descendants(pid: int) -> List[int]:
    """Every process below `pid` (read from /proc), so that a test can tell they are gone."""
    children: Dict[int, List[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        ppid = int(stat.rsplit(")", 1)[1].split()[1])
        children.setdefault(ppid, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


@dataclass
class Node:
    name: str
    host: str
    port: int
    db: Path
    log: Path
    config: Path
    # Set when the node is a container (else a process of corral_bin()).
    containers: Optional[Containers] = None
    # The process, or the attached `podman run` of the container.
    proc: Optional[subprocess.Popen] = None

    @property
    def addr(self) -> str:
        return f"{self.host}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.addr}"

    @property
    def container(self) -> str:
        assert self.containers is not None
        return f"{self.containers.prefix}-{self.name}"

    def start(self) -> None:
        serve = ["serve", "--config", str(self.config), "--listen", self.addr,
                 "--db", str(self.db), "--pool-size", "1", "--node-name", self.name]
        if self.containers is None:
            argv = [str(corral_bin()), *serve]
        else:
            podman("rm", "--force", "--ignore", self.container)
            argv = self.containers.argv(self.name, serve)
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)

    def main_pid(self) -> int:
        """The host pid of its `corral serve`."""
        assert self.proc is not None
        if self.containers is None:
            return self.proc.pid
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline:
            seen = podman("inspect", "--format", "{{.State.Pid}}", self.container)
            if seen.returncode == 0 and int(seen.stdout.strip() or 0) > 0:
                return int(seen.stdout)
            time.sleep(0.2)
        pytest.fail(f"container {self.container} has no process", pytrace=False)

    def kill(self) -> None:
        """SIGKILL: the process, or `podman kill` of the container."""
        assert self.proc is not None
        if self.containers is None:
            self.proc.send_signal(signal.SIGKILL)
        else:
            killed = podman("kill", self.container)
            assert killed.returncode == 0, killed.stderr
        self.proc.wait(timeout=STOP_TIMEOUT_S)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        if self.containers is not None:
            podman("stop", "--time", str(int(STOP_TIMEOUT_S)), self.container, timeout=STOP_TIMEOUT_S + 30)
        else:
            self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            if self.containers is not None:
                podman("kill", self.container)
            self.proc.kill()
            self.proc.wait()


@dataclass
class Cluster:
    nodes: List[Node]
    routers: List[str]
    router_procs: List[subprocess.Popen]
    key: str
    other_key: str
    tmp: Path
    # `containers` or `processes` (node_mode()).
    mode: str
    logs: List[Path] = field(default_factory=list)
    # An operator key (`corral key create --operator`), added to every node as the others are.
    operator_key: str = ""

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_until_routers_see(self, up: int, timeout: float = START_TIMEOUT_S,
                               routers: Optional[List[str]] = None, listed: Optional[int] = None) -> None:
        """Until every router (`routers`, else the cluster's) has `up` nodes up, and `listed`
        of them listed by its node source (when given)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = [health(r) for r in (routers or self.routers)]
            if all(h is not None and h.get("nodes_up") == up
                   and (listed is None or h.get("nodes_listed") == listed) for h in seen):
                for node in self.nodes:
                    if node.containers is not None:
                        node.containers.remember()
                        break
                return
            for node in self.nodes:
                if node.proc is not None and node.proc.poll() is not None and time.monotonic() + 1 < deadline:
                    # A node that ended while starting: no point waiting for it.
                    deadline = time.monotonic()
            time.sleep(0.2)
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.logs)
        pytest.fail(f"the routers did not see {up} nodes up within {timeout:.0f} s: {seen}\n{tails}",
                    pytrace=False)


def node_of(sandbox_id: str) -> str:
    """The node a sandbox id names (`sbx-<hex>-<node>`)."""
    m = re.fullmatch(r"sbx-[0-9a-f]+-([a-z0-9-]+)", sandbox_id)
    assert m, f"{sandbox_id!r} names no node"
    return m.group(1)


@pytest.fixture(scope="session")
def cluster(tmp_path_factory, request) -> Cluster:
    """The cluster, once a session (test_cluster.py and test_dns.py share it; a test that
    stops a node starts it again)."""
    mode = node_mode()
    tmp = tmp_path_factory.mktemp("cluster")
    containers = None
    if mode == "containers":
        image = load_into_podman(request.getfixturevalue("node_image"))
        containers = Containers(image, f"corral-scale-{os.getpid()}", tmp)
        # The node pods' init container: every layer a node needs, in the container.
        doctor = subprocess.run(containers.argv("doctor", ["doctor", "--pod"]), capture_output=True,
                                text=True, timeout=START_TIMEOUT_S)
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert doctor.stdout.splitlines()[-1] == "pod: every layer a node needs is active"
    sys.__stderr__.write(f"\nscale suite: {NODES} nodes as {mode}"
                         f"{f' of the node image {containers.image[:12]}' if containers else ''}\n")
    config = node_config(tmp)
    port = free_port_on(NODE_HOSTS)
    nodes = [Node(f"scale-node-{i}", NODE_HOSTS[i], port, tmp / f"node{i}.db", tmp / f"node{i}.log", config,
                  containers)
             for i in range(NODES)]
    keys = [create_key(nodes[0].db, "tenant-a"), create_key(nodes[0].db, "tenant-b")]
    for node in nodes[1:]:
        for key, name in zip(keys, ["tenant-a", "tenant-b"]):
            add_key(node.db, key, name)
    operator = create_key(nodes[0].db, "operator", operator=True)
    for node in nodes[1:]:
        add_key(node.db, operator, "operator", operator=True)
    router_ports = [free_port() for _ in range(ROUTERS)]
    procs: List[subprocess.Popen] = []
    logs = [n.log for n in nodes]
    try:
        for node in nodes:
            node.start()
        for i, port in enumerate(router_ports):
            log_path = tmp / f"router{i}.log"
            logs.append(log_path)
            argv = [str(corral_bin()), "route", "--listen", f"127.0.0.1:{port}",
                    "--node", ",".join(n.addr for n in nodes),
                    "--probe-interval", "250ms", "--connect-timeout", "1s"]
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT))
        c = Cluster(nodes, [f"http://127.0.0.1:{p}" for p in router_ports], procs,
                    keys[0].secret, keys[1].secret, tmp, mode, logs, operator_key=operator.secret)
        c.wait_until_routers_see(NODES)
        yield c
    finally:
        for proc in procs:
            stop(proc)
        for node in nodes:
            node.stop()
        if containers is not None:
            host_unchanged(containers)


def host_unchanged(containers: Containers) -> None:
    """No container of this run is left, nor its cgroups, nor a mount of one of its
    containers (the nodes share the host's network: no network namespace is made)."""
    deadline = time.monotonic() + STOP_TIMEOUT_S
    while containers.ids() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = containers.ids()
    for container in left:
        podman("rm", "--force", container)
    assert not left, f"containers of the scale suite were left: {left}"
    cgroups = containers.remove_cgroups()
    assert not cgroups, f"cgroups of the scale suite's containers were left: {cgroups}"
    assert containers.seen, "no container of the scale suite was seen"
    mounts = [line for line in Path("/proc/self/mountinfo").read_text().splitlines()
              if any(seen in line for seen in containers.seen)]
    assert not mounts, f"mounts of the scale suite's containers were left: {mounts}"
