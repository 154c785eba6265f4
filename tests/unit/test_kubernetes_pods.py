"""What the kubernetes provider reads of a pod (lost, pending, ready), of its config
section, and where it takes the pods' image from. The pods here are the client's own models,
as the API server's answers decode to."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import cast

import pytest
from kubernetes_asyncio import client

from clusterctl.protocol import ProtocolError
from clusterd.config import Settings
from clusterd.nodes import NodeStatus
from clusterd.providers.base import ClusterRequest
from clusterd.providers.kubernetes.pods import lost, node_status
from clusterd.providers.kubernetes.provider import KubernetesProvider
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.keys import DaemonKey
from clusterd.tasks.spec import Resources
from clusterd.user_config import KubernetesConfig, parse


def pod(phase: str, ready: tuple[str, str | None] | None = None, *,
        deleting: bool = False, unschedulable: str | None = None) -> client.V1Pod:
    conditions = []
    if ready is not None:
        conditions.append(client.V1PodCondition(type="Ready", status=ready[0],
                                                reason=ready[1]))
    if unschedulable is not None:
        conditions.append(client.V1PodCondition(type="PodScheduled", status="False",
                                                reason="Unschedulable", message=unschedulable))
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="c-1-worker1", deletion_timestamp=(
            "2026-12-01T00:00:00Z" if deleting else None)),
        spec=client.V1PodSpec(containers=[], node_name="cpu-2"),
        status=client.V1PodStatus(phase=phase, conditions=conditions, reason=None,
                                  message=None))


def test_a_running_ready_pod_is_a_running_node() -> None:
    assert node_status(pod("Running", ("True", None))) == (NodeStatus.RUNNING, "")
    assert lost(pod("Running", ("True", None))) is None


def test_a_pod_the_kubelet_calls_not_ready_is_unreachable_not_lost() -> None:
    starting = pod("Running", ("False", "ContainersNotReady"))
    assert lost(starting) is None
    status, reason = node_status(starting)
    assert status == NodeStatus.UNREACHABLE and "not ready" in reason


def test_a_pod_whose_node_stopped_reporting_is_lost() -> None:
    # The node controller sets Ready False and gives no reason of its own.
    orphaned = pod("Running", ("False", None))
    assert lost(orphaned) == "its node cpu-2 stopped reporting (NotReady)"
    assert node_status(orphaned) == (
        NodeStatus.TERMINATED, "pod c-1-worker1: its node cpu-2 stopped reporting (NotReady)")


@pytest.mark.parametrize("gone", [pod("Failed"), pod("Succeeded"),
                                  pod("Running", ("True", None), deleting=True)])
def test_ended_or_deleted_pods_are_lost(gone: client.V1Pod) -> None:
    assert lost(gone)
    assert node_status(gone)[0] == NodeStatus.TERMINATED


def test_a_missing_pod_is_terminated_and_a_pending_one_says_why() -> None:
    assert node_status(None)[0] == NodeStatus.TERMINATED
    waiting = pod("Pending", unschedulable="0/3 nodes are available: 3 Insufficient cpu.")
    assert node_status(waiting) == (NodeStatus.PENDING,
                                    "0/3 nodes are available: 3 Insufficient cpu.")


def test_the_config_section(tmp_path: Path) -> None:
    path = tmp_path / "config.yaml"
    assert parse(path, "").kubernetes == KubernetesConfig()
    got = parse(path, "kubernetes:\n  allowed_contexts: [a, b, a]\n  networking_mode: nodeport\n"
                      "  provision_timeout: 30\n  image: reg/node:1\n  ssh_user: ubuntu\n"
                      "  image_pull_policy: Never\n  pod_config: {spec: {}}\n").kubernetes
    assert got == KubernetesConfig(("a", "b"), "nodeport", 30.0, "reg/node:1", "ubuntu",
                                   "Never", pod_config='{"spec": {}}')
    # With an autoscaler, a pod may wait minutes for the node it adds (unless told).
    scaled = parse(path, "kubernetes:\n  autoscaler: karpenter\n").kubernetes
    assert (scaled.autoscaler, scaled.provision_timeout_s) == ("karpenter", 600.0)
    assert parse(path, "kubernetes:\n  autoscaler: gke\n  provision_timeout: 60\n"
                 ).kubernetes.provision_timeout_s == 60.0
    storage = parse(path, "kubernetes:\n  ephemeral_storage: 20Gi\n"
                          "  ephemeral_storage_limit: 50Gi\n").kubernetes
    assert (storage.ephemeral_storage, storage.ephemeral_storage_limit) == ("20Gi", "50Gi")
    fragment = parse(path, "kubernetes:\n  pod_config:\n    spec:\n      tolerations:\n"
                           "        - {key: a, operator: Exists}\n").kubernetes.pod_config
    assert json.loads(fragment) == {"spec": {"tolerations": [{"key": "a",
                                                              "operator": "Exists"}]}}


@pytest.mark.parametrize(("text", "key"), [
    ("kubernetes: [a]", "kubernetes"),
    ("kubernetes:\n  allowed_contexts: a", "kubernetes.allowed_contexts"),
    ("kubernetes:\n  networking_mode: loadbalancer", "kubernetes.networking_mode"),
    ("kubernetes:\n  provision_timeout: -1", "kubernetes.provision_timeout"),
    ("kubernetes:\n  provision_timeout: true", "kubernetes.provision_timeout"),
    ("kubernetes:\n  image: ''", "kubernetes.image"),
    ("kubernetes:\n  ssh_user: 'a b'", "kubernetes.ssh_user"),
    ("kubernetes:\n  image_pull_policy: Sometimes", "kubernetes.image_pull_policy"),
    ("kubernetes:\n  contexts: [a]", "kubernetes.contexts"),
    ("kubernetes:\n  autoscaler: cluster-autoscaler", "kubernetes.autoscaler"),
    ("kubernetes:\n  ephemeral_storage: lots", "kubernetes.ephemeral_storage"),
    ("kubernetes:\n  pod_config: [a]", "kubernetes.pod_config"),
    ("kubernetes:\n  pod_config: {spec: {containers: [{command: [sh]}]}}",
     "kubernetes.pod_config"),
])
def test_bad_config_values_name_their_key(tmp_path: Path, text: str, key: str) -> None:
    with pytest.raises(ProtocolError) as refused:
        parse(tmp_path / "config.yaml", text)
    assert f": {key}: " in refused.value.message


def image_of(tmp_path: Path, config_text: str, image_id: str | None = None,
             default_image: str = "") -> str:
    """The image the provider gives a cluster's pods under this config (and the settings'
    CLUSTERD_KUBERNETES_IMAGE, `default_image`)."""
    config = parse(tmp_path / "config.yaml", config_text)
    provider = KubernetesProvider(lambda: config, cast(SSHConnections, None),
                                  DaemonKey(tmp_path / "ssh"), "clusterd-0123", tmp_path,
                                  default_image=default_image)
    request = ClusterRequest("c", "c-1", 1, Resources(image_id=image_id))
    return provider._image(request)


def test_the_image_comes_from_the_config_the_environment_or_the_task(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERD_KUBERNETES_IMAGE", "bed/node:1")
    # None set: Python's own slim image of the daemon's minor (the runtime needs that minor;
    # the pod's start script installs sshd, rsync and sudo).
    minor = f"{sys.version_info.major}.{sys.version_info.minor}"
    assert image_of(tmp_path, "") == f"docker.io/library/python:{minor}-slim"
    # A machine's default (a test bed's `exec` sets it), below what the config says.
    bed = Settings.from_env(socket_path=tmp_path / "s", runtime_dir=tmp_path,
                            state_dir=tmp_path, config_dir=tmp_path).kubernetes_image
    assert image_of(tmp_path, "", default_image=bed) == "bed/node:1"
    assert image_of(tmp_path, "kubernetes:\n  image: mine/node:2\n", None, bed) == "mine/node:2"
    assert image_of(tmp_path, "", "docker:task/node:3", bed) == "task/node:3"
