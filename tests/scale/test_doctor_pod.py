"""`corral doctor --pod`, the check the node pods' init container runs (docs/scale-out.md,
"Pod security"): on this host every layer a node needs is there and it passes; in a container
that cannot make user namespaces (bubblewrap's --disable-userns stands in for a pod without the
privileges) it fails, naming what is missing and the pod setting that gives it."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from corral_testing import corral_bin


def doctor(*wrapper: str) -> subprocess.CompletedProcess:
    return subprocess.run([*wrapper, str(corral_bin()), "doctor", "--pod"],
                          capture_output=True, text=True, timeout=120)


def test_a_host_with_every_layer_passes() -> None:
    done = doctor()
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.splitlines()[-1] == "pod: every layer a node needs is active"


def test_a_container_without_user_namespaces_is_refused_and_told_why() -> None:
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        pytest.fail("bubblewrap is missing: scripts/setup installs it", pytrace=False)
    done = doctor(bwrap, "--dev-bind", "/", "/", "--unshare-user", "--disable-userns", "--")
    assert done.returncode == 1, done.stdout + done.stderr
    last = done.stdout.splitlines()[-1]
    assert last.startswith("pod: this container cannot run a Corral node: missing user namespace"), last
    assert "isolation" in last and "privileged: true" in last and "Pod security" in last
