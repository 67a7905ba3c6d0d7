"""The node image (scripts/node-image, docs/scale-out.md): built twice from the same inputs it
has the same tag and digest; its configuration starts `corral serve` with the store it
carries; and unpacked, what it carries runs a sandbox in its `default` image (the unpacked
files run directly, the binary from the image with the store from the image; under podman, the
scale suite's nodes are containers of this image: corral_cluster.py). Needs root (umoci
unpacks as root) and umoci (scripts/setup)."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess

from corral_cluster import BUILD_TIMEOUT_S, NodeImage, build_node_image


def test_the_node_image_is_reproducible_and_runs_sandboxes(node_image: NodeImage) -> None:
    # The session's build, and a second one from the same binary.
    first = node_image.fields
    second = build_node_image(node_image.binary, node_image.work / "b")
    assert first["tag"] == second["tag"]
    assert first["digest"] == second["digest"], "the same inputs gave two digests"
    assert re.fullmatch(r"sha256:[0-9a-f]{64}", first["digest"])
    shutil.rmtree(node_image.work / "b")

    work = node_image.work
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
    # Nothing but the binary, the store, its os-release and two empty directories: no base image.
    assert sorted(os.listdir(rootfs)) == ["data", "etc", "tmp", "usr", "var"]
    assert os.listdir(rootfs / "etc") == ["os-release"]
    assert os.listdir(rootfs / "var" / "lib" / "corral" / "images") != []
    ran = subprocess.run(
        [str(rootfs / "usr" / "local" / "bin" / "corral"), "run", "--image", "default",
         "--data-dir", str(rootfs / "var" / "lib" / "corral"),
         "-c", "import pandas, matplotlib\nprint('node image', pandas.DataFrame({'a': [1, 2]}).a.sum())"],
        capture_output=True, text=True, timeout=120,
    )
    assert ran.returncode == 0, ran.stderr
    assert "node image 3" in ran.stdout
