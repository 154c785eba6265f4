"""Kubernetes clusters as people run them, on the Kubernetes test bed: GPU nodes labelled and
tainted as GKE, NVIDIA's GPU feature discovery and Karpenter do (`testbed k8s gpu-style`), the
user's pod_config merged into pods that really run, and a cluster autoscaler that adds the node
a waiting pod needs (`testbed k8s autoscaler`), which is no capacity error when the config
says there is one."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.k8sbed import TESTBED, K8sBed
from tests.support import Daemon, cloud_name, running

pytestmark = [pytest.mark.k8s, pytest.mark.ray]

CONFIG = """
kubernetes:
  allowed_contexts: [bed-a]
  image: {image}
  image_pull_policy: Never
  provision_timeout: 5
  pod_config:
    metadata:
      annotations: {{team.example/owner: ml}}
    spec:
      volumes: [{{name: scratch, emptyDir: {{}}}}]
      containers:
        - volumeMounts: [{{name: scratch, mountPath: /scratch}}]
          env: [{{name: FROM_POD_CONFIG, value: config-file}}]
"""

GPU_TASK = """
resources:
  infra: kubernetes/bed-a
  cpus: 1
  memory: 1
  accelerators: A100:1
config:
  kubernetes:
    pod_config:
      spec:
        tolerations: [{key: example.com/dedicated, operator: Exists}]
run: |
  echo gpus=$SKYPILOT_NUM_GPUS_PER_NODE
  touch /scratch/ok && echo scratch=yes
"""

# How each style names the GPU model: the label the pod must select by.
STYLES = {
    "gke": ("cloud.google.com/gke-accelerator", "nvidia-tesla-a100"),
    "gfd": ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
    "karpenter": ("karpenter.k8s.aws/instance-gpu-name", "a100"),
}


@pytest.fixture(scope="module")
def daemon(k8s: K8sBed) -> Iterator[Daemon]:
    with running(k8s.daemon("cdk8r-", CONFIG.format(image=k8s.image))) as d:
        yield d


@pytest.fixture
def gpu_style(k8s: K8sBed) -> Iterator[Any]:
    """Label and taint the GPU node in a style; as `up` made it again afterwards."""
    try:
        yield lambda style: k8s.ok("gpu-style", style)
    finally:
        k8s.ok("gpu-style", "bed")


def launch(daemon: Daemon, cluster: str, task: str, timeout: float = 900
           ) -> subprocess.CompletedProcess[str]:
    (daemon.root / f"{cluster}.yaml").write_text(task)
    return daemon.ctl("launch", "-c", cluster, f"{cluster}.yaml", timeout=timeout)


@pytest.mark.parametrize("style", sorted(STYLES))
def test_a_gpu_task_lands_on_the_gpu_node_in_each_label_style(
        k8s: K8sBed, daemon: Daemon, gpu_style: Any, style: str) -> None:
    gpu_style(style)
    node = json.loads(k8s.kubectl("get", "node", "gpu-1", "-o", "json"))
    assert {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"} in \
        node["spec"]["taints"]
    assert "skypilot.co/accelerator" not in node["metadata"]["labels"]
    cluster = f"gpu-{style}"
    result = launch(daemon, cluster, GPU_TASK)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "gpus=1" in result.stdout, result.stdout
        assert "scratch=yes" in result.stdout, result.stdout
        (pod,) = k8s.pods(cloud_name(daemon, cluster))
        assert pod["spec"]["nodeName"] == "gpu-1"
        key, value = STYLES[style]
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [{"matchExpressions": [{"key": key, "operator": "In",
                                                "values": [value]}]}]
        # The GPU taint tolerated; the config file's pod_config, then the task's, merged.
        assert pod["spec"]["tolerations"][:1] == [
            {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
        assert {"key": "example.com/dedicated", "operator": "Exists"} in \
            pod["spec"]["tolerations"]
        assert pod["metadata"]["annotations"]["team.example/owner"] == "ml"
        container = pod["spec"]["containers"][0]
        assert {"name": "FROM_POD_CONFIG", "value": "config-file"} in container["env"]
        assert container["resources"]["requests"]["ephemeral-storage"] == "4Gi"
    finally:
        daemon.ctl("down", "-y", cluster)


ONE = """
resources:
  infra: kubernetes/bed-a
  cpus: 1
  memory: 1
run: echo ran on $(hostname)
"""


def test_a_pod_waits_for_the_node_the_autoscaler_adds(k8s: K8sBed) -> None:
    config = (f"kubernetes:\n  allowed_contexts: [bed-a]\n  image: {k8s.image}\n"
              "  image_pull_policy: Never\n  autoscaler: generic\n")
    nodes = sorted(n["metadata"]["name"] for n in json.loads(
        k8s.kubectl("get", "nodes", "-o", "json"))["items"])
    # Every node held back: nothing can hold a pod until the autoscaler adds one, which
    # takes longer than a pod may wait unscheduled without an autoscaler (10 s).
    scaler = subprocess.Popen(
        [sys.executable, TESTBED, "k8s", "autoscaler", "--dir", str(k8s.dir),
         "--boot-delay", "15", *nodes], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True)
    try:
        assert scaler.stdout is not None
        first = scaler.stdout.readline()
        assert first.startswith("autoscaler: watching"), first + scaler.stderr.read()
        with running(k8s.daemon("cdk8s-", config)) as daemon:
            result = launch(daemon, "grow", ONE)
            assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
            assert "waits for a node" in result.stderr, result.stderr
            assert "for the generic autoscaler to add one" in result.stderr, result.stderr
            events = daemon.ctl("events", "grow").stdout
            assert "autoscaler to add one" in events, events
            said = [scaler.stdout.readline() for _ in range(2)]  # what it saw, what it did
            added = said[-1]
            assert said[0].startswith("autoscaler: pod bed-a/"), said
            assert added.startswith("autoscaler: added "), said
            (pod,) = k8s.pods(cloud_name(daemon, "grow"))
            assert pod["spec"]["nodeName"] == added.split()[-1]
            assert daemon.ctl("down", "-y", "grow").returncode == 0
    finally:
        scaler.terminate()
        out, err = scaler.communicate(timeout=60)
    assert scaler.returncode == 0, out + err
    cordoned = [n["metadata"]["name"] for n in json.loads(
        k8s.kubectl("get", "nodes", "-o", "json"))["items"] if n["spec"].get("unschedulable")]
    assert cordoned == []


def test_the_default_image_a_plain_python_one_gets_sshd_and_rsync_at_start(
        k8s: K8sBed) -> None:
    # The bed's stand-in for python:3.11-slim (Debian, python3 and nothing else clusterd
    # needs; entrypoint python3) in every node, and Debian's archive within the pods' reach
    # (as deb.debian.org, through a host alias: the bed has no DNS).
    plain = json.loads(k8s.ok("plain-image", "--json", timeout=1200))
    assert plain["image"] == "docker.io/library/python:3.11-slim"
    config = ("kubernetes:\n  allowed_contexts: [bed-a]\n"  # no image: the default
              f"  pod_config: {json.dumps(plain['pod_config'])}\n")
    task = ("resources:\n  infra: kubernetes/bed-a\n  cpus: 1\n  memory: 1\n"
            "run: echo plain $(ls /usr/sbin/sshd) $(command -v rsync) as $(whoami)\n")
    with running(k8s.daemon("cdk8p-", config)) as daemon:
        result = launch(daemon, "plain", task)
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "plain /usr/sbin/sshd /usr/bin/rsync as sky" in result.stdout, result.stdout
        (pod,) = k8s.pods(cloud_name(daemon, "plain"))
        assert pod["spec"]["containers"][0]["image"] == plain["image"]
        logs = k8s.kubectl("logs", "-n", pod["metadata"]["namespace"],
                           pod["metadata"]["name"])
        assert "clusterd-pod: the image lacks sshd rsync sudo: installing it" in logs, logs


def test_nodeport_on_private_nodes_is_refused_saying_why(k8s: K8sBed) -> None:
    config = (f"kubernetes:\n  allowed_contexts: [bed-a]\n  image: {k8s.image}\n"
              "  image_pull_policy: Never\n  networking_mode: nodeport\n"
              )
    k8s.ok("private-nodes", "on")
    try:
        with running(k8s.daemon("cdk8v-", config)) as daemon:
            result = launch(daemon, "private", ONE, timeout=300)
            assert result.returncode != 0, result.stdout
            assert "networking_mode nodeport cannot reach node" in result.stderr, \
                result.stderr + daemon.log()[-3000:]
            assert "No route to host" in result.stderr, result.stderr
            assert "(use portforward)" in result.stderr, result.stderr
            # The failed attempt's pods and Services are gone (failover removes them).
            assert not any(p["metadata"]["labels"].get("clusterd-cluster") == "private"
                           for p in json.loads(k8s.kubectl("get", "pods,services", "-A",
                                                           "-o", "json"))["items"])
    finally:
        k8s.ok("private-nodes", "off")
