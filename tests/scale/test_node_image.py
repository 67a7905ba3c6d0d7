"""The node image (scripts/node-image, docs/scale-out.md): built twice from the same inputs it
has the same tag and digest; its configuration starts `corral serve` with the store it
carries; and unpacked, what it carries runs a sandbox in its `default` image (without a
container runtime: the unpacked files are run directly, the binary from the image with the
store from the image). Needs root (umoci unpacks as root) and umoci (scripts/setup)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict

import pytest

from corral_cluster import REPO, corral_bin

BUILD_TIMEOUT_S = 900


def build(binary: Path, out: Path) -> Dict[str, str]:
    done = subprocess.run([str(REPO / "scripts" / "node-image"), "--binary", str(binary), "--out", str(out)],
                          capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-4000:]
    fields = dict(re.findall(r"^(layout|tag|digest|size)\s+(.*)$", done.stdout, re.M))
    assert set(fields) == {"layout", "tag", "digest", "size"}, done.stdout
    return fields


def test_the_node_image_is_reproducible_and_runs_sandboxes() -> None:
    if os.geteuid() != 0:
        pytest.fail("the node image test needs root (umoci unpack keeps the image's owners)", pytrace=False)
    if shutil.which("umoci") is None:
        pytest.fail("umoci is missing: scripts/setup installs it", pytrace=False)
    # Outside pytest's private temporary directory: the sandbox's unprivileged user must be
    # able to enter the image's store, as it can in /var/lib/corral of a node.
    work = Path(tempfile.mkdtemp(prefix="corral-node-image-", dir="/var/tmp"))
    try:
        work.chmod(0o755)
        check_image(work)
    finally:
        shutil.rmtree(work)


def check_image(work: Path) -> None:
    # Both builds from one copy of the binary: a build elsewhere may replace the original.
    binary = work / "corral"
    shutil.copy2(corral_bin(), binary)
    first = build(binary, work / "a")
    second = build(binary, work / "b")
    assert first["tag"] == second["tag"]
    assert first["digest"] == second["digest"], "the same inputs gave two digests"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first["digest"])
    shutil.rmtree(work / "b")

    tag = first["tag"].split(":", 1)[1]
    bundle = work / "bundle"
    subprocess.run(["umoci", "unpack", "--image", f"{first['layout']}:{tag}", str(bundle)],
                   check=True, capture_output=True, timeout=BUILD_TIMEOUT_S)
    bundle.chmod(0o755)
    spec = json.loads((bundle / "config.json").read_text())
    assert spec["process"]["args"] == ["/usr/local/bin/corral", "serve"]
    assert "CORRAL_DATA_DIR=/var/lib/corral" in spec["process"]["env"]
    rootfs = bundle / "rootfs"
    # Every directory on the way to the binary and the store is open to others: the routers
    # run as an unprivileged user, and sandboxes enter the store as one.
    for d in (rootfs, rootfs / "usr" / "local" / "bin", rootfs / "var" / "lib" / "corral" / "images"):
        assert d.stat().st_mode & 0o005 == 0o005, f"{d} is not open to others"
    # Nothing but the binary, the store and two empty directories: no base image.
    assert sorted(os.listdir(rootfs)) == ["data", "tmp", "usr", "var"]
    assert os.listdir(rootfs / "var" / "lib" / "corral" / "images") != []
    ran = subprocess.run(
        [str(rootfs / "usr" / "local" / "bin" / "corral"), "run", "--image", "default",
         "--data-dir", str(rootfs / "var" / "lib" / "corral"),
         "-c", "import pandas, matplotlib\nprint('node image', pandas.DataFrame({'a': [1, 2]}).a.sum())"],
        capture_output=True, text=True, timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "node image 3" in ran.stdout
