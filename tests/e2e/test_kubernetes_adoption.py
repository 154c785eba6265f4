"""A create that meets its pod's name taken (409) on the Kubernetes test bed: a daemon killed
right after its create finds its own pod when the launch resumes and adopts it; a pod someone
else made under that name, with our labels copied (and our public key, which every pod of ours
carries in its environment), is refused with a clear error and gets nothing from the daemon:
no SSH, no host key pinned, no runtime, no Ray token."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from typing import Any

import pytest

from clusterd.providers.kubernetes.manifests import PodSpec, pod_manifest
from clusterd.ssh.keys import DaemonKey
from tests.e2e.k8sbed import K8sBed
from tests.support import Daemon, cloud_name, running

pytestmark = [pytest.mark.k8s, pytest.mark.ray]

CONFIG = """
kubernetes:
  allowed_contexts: [bed-a]
  image: {image}
  image_pull_policy: Never
  provision_timeout: 5
"""
ONE = """
resources:
  infra: kubernetes/bed-a
  cpus: 0.5
  memory: 1
run: echo one on $(hostname)
"""


@pytest.fixture
def daemon(k8s: K8sBed) -> Iterator[Daemon]:
    with running(k8s.daemon("cdk8o-", CONFIG.format(image=k8s.image))) as d:
        yield d


def launch(daemon: Daemon, cluster: str) -> subprocess.CompletedProcess[str]:
    (daemon.root / "one.yaml").write_text(ONE)
    return daemon.ctl("launch", "-c", cluster, "one.yaml", timeout=900)


def killed_at(daemon: Daemon, point: str, cluster: str) -> str:
    """Launch `cluster` with the daemon armed to die at `point`, start it again; the cloud
    name the interrupted launch recorded."""
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_TEST_FAULTS": point})
    launch(daemon, cluster)
    daemon.wait_killed_at_fault_point()
    daemon.start()
    return cloud_name(daemon, cluster)


def pod(k8s: K8sBed, name: str) -> dict[str, Any]:
    got: dict[str, Any] = json.loads(k8s.kubectl("get", "pod", name, "-n", "bed-a",
                                                    "-o", "json"))
    return got


def test_a_launch_resumed_after_its_create_adopts_its_own_pod(k8s: K8sBed,
                                                              daemon: Daemon) -> None:
    cloud = killed_at(daemon, "launch.after_create", "resumed")
    made = pod(k8s, f"{cloud}-head")["metadata"]
    result = launch(daemon, "resumed")
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
    assert "resuming the interrupted launch" in result.stderr
    assert f"one on {cloud}-head" in result.stdout
    # The very pod the killed daemon's create made: adopted, not made again.
    assert pod(k8s, f"{cloud}-head")["metadata"]["uid"] == made["uid"]


def test_a_pod_planted_under_our_pods_name_is_refused_and_gets_nothing(
        k8s: K8sBed, daemon: Daemon) -> None:
    cloud = killed_at(daemon, "launch.before_create", "planted")
    managed_by = (daemon.state_dir / "daemon-id").read_text().strip()
    public_key = DaemonKey(daemon.state_dir / "ssh").ensure().public_openssh.strip()
    # What the daemon's create would send, but the create token: its labels, our key, an
    # image without clusterd's runtime (so a runtime there is one the daemon installed).
    spec = PodSpec(cloud, "planted", managed_by, k8s.env["CLUSTERD_TESTBED_K8S_NODE_IMAGE"],
                   "Never", public_key, 0.5, 1.0)
    manifest = daemon.root / "planted.json"
    manifest.write_text(json.dumps(pod_manifest(spec, 0)))
    k8s.kubectl("create", "-n", "bed-a", "-f", str(manifest))
    k8s.kubectl("wait", "-n", "bed-a", "--for=condition=Ready", "--timeout=120s",
                f"pod/{cloud}-head")
    uid = str(pod(k8s, f"{cloud}-head")["metadata"]["uid"])

    result = launch(daemon, "planted")
    assert result.returncode != 0
    assert (f"refusing the pod {cloud}-head in namespace bed-a: it was not made by this "
            "launch") in result.stderr, result.stderr
    assert "launch the cluster under another name" in result.stderr
    for later_phase in ("installing", "starting Ray", "one on"):
        assert later_phase not in result.stderr + result.stdout
    known_hosts = daemon.state_dir / "known_hosts"
    assert uid not in (known_hosts.read_text() if known_hosts.exists() else "")
    assert f"k8s-pod-{uid}" not in daemon.log()
    # The daemon keeps serving.
    assert daemon.ctl("status").returncode == 0
