"""Helpers of the scale suite (a module of its own, not conftest.py: several suites run in one
pytest process, and each has a conftest). A Corral cluster on one machine: three `corral serve`
nodes (each its own port, database
and node name; the image store of $CORRAL_DATA_DIR is shared, read-only) and two `corral
route` replicas in front of them, as docs/scale-out.md deploys it on Kubernetes. Two API keys
and an operator key are made on the first node and added to the others with `corral key add`,
as the cluster's Secret would be.

The binary is $CORRAL_BIN, else target/debug/corral; every process is stopped at the end.
"""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Dict, List, Optional

import pytest

REPO = Path(__file__).resolve().parents[2]
START_TIMEOUT_S = 180.0
STOP_TIMEOUT_S = 30.0
NODES = 3
ROUTERS = 2


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


def corral_bin() -> Path:
    env = os.environ.get("CORRAL_BIN")
    path = Path(env) if env else REPO / "target" / "debug" / "corral"
    if not (path.is_file() and os.access(path, os.X_OK)):
        pytest.fail(f"no corral binary at {path}: build it (cargo build -p corral) or set CORRAL_BIN",
                    pytrace=False)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def health(url: str) -> Optional[dict]:
    try:
        with urllib.request.urlopen(f"{url}/healthz", timeout=2) as r:
            return json.loads(r.read())
    except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
        return None


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
    port: int
    db: Path
    log: Path
    config: Path
    proc: Optional[subprocess.Popen] = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [str(corral_bin()), "serve", "--config", str(self.config), "--listen", f"127.0.0.1:{self.port}",
                "--db", str(self.db), "--pool-size", "1", "--node-name", self.name]
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                         stderr=subprocess.STDOUT)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
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
    logs: List[Path] = field(default_factory=list)
    # An operator key (`corral key create --operator`), added to every node as the others are.
    operator_key: str = ""

    def node(self, name: str) -> Node:
        return next(n for n in self.nodes if n.name == name)

    def wait_until_routers_see(self, up: int, timeout: float = START_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            seen = [health(r) for r in self.routers]
            if all(h is not None and h.get("nodes_up") == up for h in seen):
                return
            time.sleep(0.2)
        tails = "\n".join(f"--- {p.name}\n{p.read_text(errors='replace')[-2000:]}" for p in self.logs)
        pytest.fail(f"the routers did not see {up} nodes up within {timeout:.0f} s: {seen}\n{tails}",
                    pytrace=False)


def node_of(sandbox_id: str) -> str:
    """The node a sandbox id names (`sbx-<hex>-<node>`)."""
    m = re.fullmatch(r"sbx-[0-9a-f]+-([a-z0-9-]+)", sandbox_id)
    assert m, f"{sandbox_id!r} names no node"
    return m.group(1)


def _make_key(db: Path, name: str, operator: bool = False) -> tuple:
    made = subprocess.run([str(corral_bin()), "key", "create", "--name", name, "--db", str(db)]
                          + (["--operator"] if operator else []),
                          capture_output=True, text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    key_id = re.search(r"key-[0-9a-f]{12}", made.stderr).group(0)
    return key_id, made.stdout.strip()


def _add_key(db: Path, key_id: str, name: str, secret: str, operator: bool = False) -> None:
    added = subprocess.run([str(corral_bin()), "key", "add", "--id", key_id, "--name", name, "--db", str(db)]
                           + (["--operator"] if operator else []),
                           input=secret + "\n", capture_output=True, text=True, timeout=60)
    assert added.returncode == 0, added.stderr


@pytest.fixture(scope="module")
def cluster(tmp_path_factory) -> Cluster:
    tmp = tmp_path_factory.mktemp("cluster")
    config = node_config(tmp)
    nodes = [Node(f"scale-node-{i}", free_port(), tmp / f"node{i}.db", tmp / f"node{i}.log", config)
             for i in range(NODES)]
    keys = [_make_key(nodes[0].db, "tenant-a"), _make_key(nodes[0].db, "tenant-b")]
    for node in nodes[1:]:
        for (key_id, secret), name in zip(keys, ["tenant-a", "tenant-b"]):
            _add_key(node.db, key_id, name, secret)
    operator = _make_key(nodes[0].db, "operator", operator=True)
    for node in nodes[1:]:
        _add_key(node.db, operator[0], "operator", operator[1], operator=True)
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
                    "--node", ",".join(f"127.0.0.1:{n.port}" for n in nodes),
                    "--probe-interval", "250ms", "--connect-timeout", "1s"]
            with open(log_path, "wb") as log:
                procs.append(subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                              stderr=subprocess.STDOUT))
        c = Cluster(nodes, [f"http://127.0.0.1:{p}" for p in router_ports], procs,
                    keys[0][1], keys[1][1], tmp, logs, operator_key=operator[1])
        c.wait_until_routers_see(NODES)
        yield c
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                try:
                    proc.wait(timeout=STOP_TIMEOUT_S)
                except subprocess.TimeoutExpired:
                    proc.kill()
                    proc.wait()
        for node in nodes:
            node.stop()
