"""What goes into a pod beyond the task's size: the GPU node selector in the label style the
nodes carry, the GPU taint's toleration, local disk, the user's pod_config (merged, or refused
by name where it would break clusterd), and the NodePort address the daemon can reach."""

from __future__ import annotations

import re
import socket
import time
from pathlib import Path
from typing import Any

import anyio
import pytest
from kubernetes_asyncio import client

from clusterctl.protocol import ProtocolError
from clusterd import pod_config
from clusterd.providers.kubernetes import gpu_labels, nodeport
from clusterd.providers.kubernetes.manifests import PodSpec, pod_manifest
from clusterd.providers.kubernetes.pods import ended
from clusterd.tasks.loader import load_task

STYLES = [
    ("skypilot.co/accelerator", "a100"),
    ("nvidia.com/gpu.product", "NVIDIA-A100-SXM4-80GB"),
    ("cloud.google.com/gke-accelerator", "nvidia-tesla-a100"),
    ("karpenter.k8s.aws/instance-gpu-name", "a100"),
]


@pytest.mark.parametrize(("key", "value"), STYLES)
def test_gpu_nodes_are_selected_by_the_label_they_carry(key: str, value: str) -> None:
    seen = [(key, value), ("nvidia.com/gpu.product", "Tesla-T4")]
    chosen = gpu_labels.selector_for("A100", seen, None)
    assert chosen.terms == ((key, (value,)),)
    assert chosen.node_affinity() == {"requiredDuringSchedulingIgnoredDuringExecution": {
        "nodeSelectorTerms": [{"matchExpressions": [
            {"key": key, "operator": "In", "values": [value]}]}]}}


def test_nodes_in_several_styles_are_any_of_them_and_autoscalers_add_their_own() -> None:
    seen = [("cloud.google.com/gke-accelerator", "nvidia-l4"),
            ("nvidia.com/gpu.product", "NVIDIA-L4")]
    assert gpu_labels.selector_for("L4", seen, None).terms == (
        ("nvidia.com/gpu.product", ("NVIDIA-L4",)),
        ("cloud.google.com/gke-accelerator", ("nvidia-l4",)))
    # No L4 node yet: GKE's autoscaler adds nodes labelled the GKE way.
    assert gpu_labels.selector_for("T4", [], "gke").terms == (
        ("cloud.google.com/gke-accelerator", ("nvidia-tesla-t4",)),)
    assert gpu_labels.selector_for("A100", [], "karpenter").terms == (
        ("nvidia.com/gpu.product", ("NVIDIA-A100", "Tesla-A100")),
        ("karpenter.k8s.aws/instance-gpu-name", ("a100",)))
    # Nodes that cannot be read: every style's usual spelling.
    unread = dict(gpu_labels.selector_for("H100", None, None).terms)
    assert unread["cloud.google.com/gke-accelerator"] == (
        "nvidia-h100", "nvidia-h100-80gb", "nvidia-h100-mega-80gb")
    assert set(unread) == set(gpu_labels.LABEL_KEYS)


def spec(**extra: Any) -> PodSpec:
    return PodSpec("c-1", "c", "d", "img", "Never", "k", 2, 4, **extra)


def test_a_gpu_pod_selects_by_affinity_and_tolerates_the_gpu_taint() -> None:
    chosen = gpu_labels.selector_for("A100", [STYLES[2]], None)
    pod = pod_manifest(spec(gpus=1, accelerator="A100", gpu_selector=chosen), 0)
    affinity = pod["spec"]["affinity"]
    assert affinity["nodeAffinity"] == chosen.node_affinity()
    assert "podAntiAffinity" in affinity  # kept
    assert pod["spec"]["tolerations"] == [gpu_labels.GPU_TOLERATION]


def test_local_disk_is_asked_for() -> None:
    pod = pod_manifest(spec(ephemeral_storage="4Gi", ephemeral_storage_limit="50Gi"), 0)
    resources = pod["spec"]["containers"][0]["resources"]
    assert resources["requests"]["ephemeral-storage"] == "4Gi"
    assert resources["limits"]["ephemeral-storage"] == "50Gi"


CONFIG_FRAGMENT = {
    "metadata": {"labels": {"team": "ml"}, "annotations": {"a": "b"}},
    "spec": {"tolerations": [{"key": "dedicated", "operator": "Equal", "value": "ml",
                              "effect": "NoSchedule"}],
             "imagePullSecrets": [{"name": "regcred"}],
             "securityContext": {"fsGroup": 1000},
             "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
             "containers": [{"volumeMounts": [{"name": "data", "mountPath": "/data"}],
                             "securityContext": {"capabilities": {"add": ["SYS_PTRACE"]}},
                             "env": [{"name": "HF_HOME", "value": "/data/hf"}],
                             "resources": {"limits": {"rdma/hca": "1"}}}]},
}


def test_pod_config_is_merged_config_first_then_the_task() -> None:
    task = {"spec": {"tolerations": [{"key": "spot", "operator": "Exists"}],
                     "securityContext": {"runAsNonRoot": True}}}
    fragments = (pod_config.parse(CONFIG_FRAGMENT, "kubernetes.pod_config"),
                 pod_config.parse(task, "config.kubernetes.pod_config"))
    pod = pod_manifest(spec(gpus=1, accelerator="A100", pod_configs=fragments), 0)
    assert pod["metadata"]["labels"]["team"] == "ml"
    assert pod["metadata"]["labels"]["clusterd-cluster-name"] == "c-1"  # ours kept
    assert pod["spec"]["tolerations"] == [
        gpu_labels.GPU_TOLERATION, CONFIG_FRAGMENT["spec"]["tolerations"][0],
        {"key": "spot", "operator": "Exists"}]
    assert pod["spec"]["imagePullSecrets"] == [{"name": "regcred"}]
    assert pod["spec"]["securityContext"] == {"fsGroup": 1000, "runAsNonRoot": True}
    assert [v["name"] for v in pod["spec"]["volumes"]] == ["dshm", "data"]
    container = pod["spec"]["containers"][0]
    assert [m["mountPath"] for m in container["volumeMounts"]] == ["/dev/shm", "/data"]
    assert [e["name"] for e in container["env"]] == ["CLUSTERD_SSH_PUBLIC_KEY",
                                                   "CLUSTERD_SSH_USER", "HF_HOME"]
    assert container["resources"]["limits"] == {"memory": "4Gi", "nvidia.com/gpu": "1",
                                                "rdma/hca": "1"}
    assert container["securityContext"] == {"capabilities": {"add": ["SYS_PTRACE"]}}
    assert container["image"] == "img"
    assert container["command"][:2] == ["/bin/sh", "-c"]


@pytest.mark.parametrize(("fragment", "named"), [
    ({"spec": {"containers": [{"command": ["sleep", "inf"]}]}}, "containers[0].command"),
    ({"spec": {"containers": [{"image": "x"}]}}, "containers[0].image"),
    ({"spec": {"containers": [{}, {"name": "sidecar"}]}}, "one container only"),
    ({"spec": {"restartPolicy": "Always"}}, "spec.restartPolicy"),
    ({"metadata": {"labels": {"clusterd-cluster": "x"}}}, "labels.clusterd-cluster"),
    ({"metadata": {"name": "x"}}, "metadata.name"),
    ({"spec": {"containers": [{"resources": {"requests": {"cpu": "8"}}}]}},
     "resources.requests.cpu"),
    ({"spec": {"tolerations": {"key": "a"}}}, "spec.tolerations: expected a list"),
    ({"kind": "Deployment"}, "kind"),
])
def test_what_would_break_clusterd_is_refused_by_name(fragment: dict[str, Any],
                                                      named: str) -> None:
    with pytest.raises(pod_config.PodConfigError, match=re.escape(named)):
        pod_config.parse(fragment, "kubernetes.pod_config")


def test_a_name_clusterd_uses_is_refused_not_overwritten() -> None:
    clash = pod_config.parse({"spec": {"volumes": [{"name": "dshm", "emptyDir": {}}]}}, "x")
    with pytest.raises(pod_config.PodConfigError, match="'dshm' is in the pod already"):
        pod_manifest(spec(pod_configs=(clash,)), 0)


def test_a_task_sets_pod_config_under_config_kubernetes(tmp_path: Path) -> None:
    task = tmp_path / "t.yaml"
    task.write_text("run: hi\nconfig:\n  kubernetes:\n    pod_config:\n      spec:\n"
                    "        imagePullSecrets: [{name: regcred}]\n")
    loaded = load_task(yaml_path=str(task), cwd=str(tmp_path))
    fragment = '{"spec": {"imagePullSecrets": [{"name": "regcred"}]}}'
    assert loaded.resources.pod_config == fragment
    task.write_text(task.read_text() + "resources:\n  any_of:\n    - {infra: kubernetes}\n"
                    "    - {infra: aws}\n")
    loaded = load_task(yaml_path=str(task), cwd=str(tmp_path))
    assert [r.pod_config for r in loaded.resource_choices] == [fragment, fragment]
    task.write_text("run: hi\nconfig:\n  kubernetes:\n    provision_timeout: 5\n")
    with pytest.raises(ProtocolError, match=re.escape(
            "config.kubernetes.provision_timeout: not supported per task")):
        load_task(yaml_path=str(task), cwd=str(tmp_path))
    task.write_text("run: hi\nconfig:\n  jobs: {}\n")
    with pytest.raises(ProtocolError, match=re.escape("config.jobs: not supported per task")):
        load_task(yaml_path=str(task), cwd=str(tmp_path))


class FakeAddress:
    def __init__(self, type_: str, address: str) -> None:
        self.type, self.address = type_, address


class FakeNode:
    def __init__(self, *addresses: tuple[str, str]) -> None:
        self.status = type("S", (), {"addresses": [FakeAddress(*a) for a in addresses]})()


def test_node_addresses_put_the_external_one_first() -> None:
    node = FakeNode(("Hostname", "n1"), ("InternalIP", "10.0.0.5"), ("ExternalIP", "34.1.2.3"))
    assert nodeport.node_addresses(node, "10.0.0.5") == [("ExternalIP", "34.1.2.3"),
                                                         ("InternalIP", "10.0.0.5")]
    assert nodeport.node_addresses(None, "10.0.0.7") == [("InternalIP", "10.0.0.7")]


def test_the_address_used_is_one_that_answers() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    port = listener.getsockname()[1]
    closed = socket.socket()
    closed.bind(("127.0.0.2", 0))  # bound, not listening: the port is refused there
    try:
        found, tried = anyio.run(nodeport.reachable,
                                 [("ExternalIP", "127.0.0.2"), ("InternalIP", "127.0.0.1")],
                                 port)
        assert found == "127.0.0.1"
        assert len(tried) == 1 and tried[0].startswith(f"ExternalIP 127.0.0.2:{port}: ")
        assert "refused" in tried[0].lower()
        started = time.monotonic()
        found, tried = anyio.run(nodeport.reachable, [("ExternalIP", "127.0.0.2")], port, 1.0)
        assert found is None and tried == [
            f"ExternalIP 127.0.0.2:{port}: Connection refused (ECONNREFUSED)"]
        assert 1.0 <= time.monotonic() - started < 10  # tried again for a while, not forever
        # No route: nothing to wait for.
        started = time.monotonic()
        found, tried = anyio.run(nodeport.reachable, [("ExternalIP", "not-an-ip")], port, 30.0)
        assert found is None and tried == ["ExternalIP not-an-ip: not an IP address"]
        assert time.monotonic() - started < 5
    finally:
        listener.close()
        closed.close()


def failed_pod(reason: str | None, message: str | None,
               terminated: str | None = None) -> client.V1Pod:
    statuses = [client.V1ContainerStatus(
        name="node", image="i", image_id="", ready=False, restart_count=0,
        state=client.V1ContainerState(terminated=client.V1ContainerStateTerminated(
            exit_code=1, message=terminated)))] if terminated is not None else []
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name="c-1-head"),
        spec=client.V1PodSpec(containers=[], node_name="cpu-1"),
        status=client.V1PodStatus(phase="Failed", reason=reason, message=message,
                                  container_statuses=statuses))


def test_an_eviction_for_local_disk_is_named_as_such() -> None:
    over = ended(failed_pod("Evicted", "Pod ephemeral local storage usage exceeds the total "
                                       "limit of containers 50Gi."))
    assert over is not None and over.startswith(
        "Evicted for local disk: the pod wrote more than its ephemeral-storage limit allows")
    assert "kubernetes.ephemeral_storage" in over
    full = ended(failed_pod("Evicted", "The node was low on resource: ephemeral-storage."))
    assert full is not None and "its node ran out of local disk" in full


def test_a_start_script_that_gave_up_says_why() -> None:
    said = "the image lacks sshd and has no package manager clusterd knows"
    assert ended(failed_pod(None, None, said)) == \
        f"Failed: its container exited with 1: {said}"
