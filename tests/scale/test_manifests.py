"""The Kubernetes manifests of deploy/kubernetes (docs/scale-out.md): every file the
kustomization lists exists and every manifest is listed; each resource validates against the
Kubernetes API schema in strict mode (kubernetes-validate, whose schemas ship in its PyPI
package: nothing is downloaded), and a typo fails; and the resources agree with each other and
with what `corral route` and `corral serve` expect (names, ports, probes, the node name)."""

from __future__ import annotations

import tomllib
from pathlib import Path
from typing import Any, Dict, List

import pytest

try:
    import kubernetes_validate
    import yaml  # kubernetes-validate's own dependency
except ImportError:  # a missing validator fails the suite; it never skips it
    pytest.fail("kubernetes-validate is not installed: pip install -r tests/requirements.txt", pytrace=False)

DEPLOY = Path(__file__).resolve().parents[2] / "deploy" / "kubernetes"
VERSION = kubernetes_validate.latest_version()


def kustomization() -> Dict[str, Any]:
    return yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())


def resources() -> Dict[str, Dict[str, Any]]:
    """Every resource of the kustomization, by `Kind/name`."""
    found: Dict[str, Dict[str, Any]] = {}
    for name in kustomization()["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
            found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def test_the_kustomization_lists_every_manifest_and_only_those() -> None:
    listed = kustomization()["resources"]
    on_disk = sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")
    assert sorted(listed) == on_disk
    assert len(set(listed)) == len(listed)


@pytest.mark.parametrize("name", kustomization()["resources"])
def test_each_manifest_validates_against_the_api_schema_strictly(name: str) -> None:
    for doc in yaml.safe_load_all((DEPLOY / name).read_text()):
        kubernetes_validate.validate(doc, VERSION, strict=True)


def test_a_typo_fails_strict_validation() -> None:
    statefulset = resources()["StatefulSet/corral-node"]
    typo = yaml.safe_load(yaml.safe_dump(statefulset))
    typo["spec"]["replica"] = typo["spec"].pop("replicas")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(typo, VERSION, strict=True)
    probe = yaml.safe_load(yaml.safe_dump(statefulset))
    probe["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/healthz"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(probe, VERSION, strict=True)


def args_of(container: Dict[str, Any]) -> List[str]:
    return [str(a) for a in container.get("args", [])]


def test_the_resources_agree_with_each_other_and_with_corral() -> None:
    r = resources()
    namespace = kustomization()["namespace"]
    headless = r["Service/corral-node"]
    statefulset = r["StatefulSet/corral-node"]
    router = r["Deployment/corral-router"]
    assert headless["spec"]["clusterIP"] == "None"
    assert statefulset["spec"]["serviceName"] == "corral-node"
    pod = statefulset["spec"]["template"]["spec"]
    node = pod["containers"][0]
    # Each node is named after its pod: sandbox ids end in it.
    env = {e["name"]: e for e in node["env"]}
    assert env["CORRAL_NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    port = next(p["containerPort"] for p in node["ports"] if p["name"] == "http")
    assert headless["spec"]["ports"][0]["port"] == port
    config = tomllib.loads(r["ConfigMap/corral-node-config"]["data"]["corral.toml"])
    assert config["listen"].endswith(f":{port}") and not config["listen"].startswith("127.")
    for probe in ("readinessProbe", "livenessProbe"):
        assert node[probe]["httpGet"]["path"] == "/healthz"
    # The routers resolve the headless Service, on the nodes' port.
    route = router["spec"]["template"]["spec"]["containers"][0]
    argv = args_of(route)
    assert argv[0] == "route"
    assert argv[argv.index("--nodes-dns") + 1] == f"corral-node.{namespace}.svc.cluster.local:{port}"
    listen = argv[argv.index("--listen") + 1]
    router_port = next(p["containerPort"] for p in route["ports"] if p["name"] == "http")
    assert listen == f"0.0.0.0:{router_port}"
    assert route["readinessProbe"]["httpGet"]["path"] == "/healthz"
    assert r["Service/corral"]["spec"]["selector"] == router["spec"]["selector"]["matchLabels"]
    # The doctor refuses a pod that cannot hold sandboxes; the key comes from the Secret.
    inits = {c["name"]: c for c in pod["initContainers"]}
    assert args_of(inits["doctor"]) == ["doctor", "--pod"]
    keys = args_of(inits["keys"])
    assert keys[:2] == ["key", "add"] and "--secret-file" in keys
    assert set(r["Secret/corral-keys"]["stringData"]) == {"id", "name", "secret"}
    # The operator key comes from a Secret of its own, added as an operator key.
    operator = args_of(inits["operator-key"])
    assert operator[:3] == ["key", "add", "--operator"] and "--secret-file" in operator
    assert set(r["Secret/corral-operator-key"]["stringData"]) == {"id", "name", "secret"}
    mounted = {v["name"]: v for v in pod["volumes"]}
    assert mounted["operator-key"]["secret"]["secretName"] == "corral-operator-key"
    # The budget, the autoscaler and the Services select what exists.
    assert r["PodDisruptionBudget/corral-node"]["spec"]["selector"] == statefulset["spec"]["selector"]
    assert r["PodDisruptionBudget/corral-router"]["spec"]["selector"] == router["spec"]["selector"]
    hpa = r["HorizontalPodAutoscaler/corral-node"]["spec"]
    assert hpa["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "StatefulSet", "name": "corral-node"}
    assert hpa["metrics"][0]["pods"]["metric"]["name"] == "corral_sessions_live"
    for doc in r.values():
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace, doc["metadata"]
