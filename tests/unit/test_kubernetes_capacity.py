"""The kubernetes provider's arithmetic: quantities, what nodes can hold, and the pods it asks
for (checked by the real API server in the e2e tests; here, what they say)."""

from __future__ import annotations

import pytest
from kubernetes_asyncio import client

from clusterd.providers.kubernetes.capacity import (
    accelerator_name,
    capacities,
    nearest,
    parse_quantity,
)
from clusterd.providers.kubernetes.manifests import PodSpec, pod_manifest, pod_name


@pytest.mark.parametrize(("text", "value"), [
    ("2", 2.0), ("500m", 0.5), ("8Gi", 8 * 1024**3), ("7985404Ki", 7985404 * 1024),
    ("1e3", 1000.0), ("1.5", 1.5), ("100M", 1e8), ("250u", 0.00025),
])
def test_quantities(text: str, value: float) -> None:
    assert parse_quantity(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["", "two", "8GiB", "1.2.3", "--1"])
def test_not_quantities(text: str) -> None:
    with pytest.raises(ValueError):
        parse_quantity(text)


def node(name: str, cpu: str, memory: str, gpus: str | None = None,
         labels: dict[str, str] | None = None, ready: bool = True) -> client.V1Node:
    allocatable = {"cpu": cpu, "memory": memory, **({"nvidia.com/gpu": gpus} if gpus else {})}
    return client.V1Node(
        metadata=client.V1ObjectMeta(name=name, labels=labels or {}),
        spec=client.V1NodeSpec(unschedulable=None),
        status=client.V1NodeStatus(allocatable=allocatable, conditions=[
            client.V1NodeCondition(type="Ready", status="True" if ready else "False")]))


def pod(on: str, cpu: str, memory: str, gpus: str | None = None,
        phase: str = "Running") -> client.V1Pod:
    limits = {"nvidia.com/gpu": gpus} if gpus else None
    return client.V1Pod(
        spec=client.V1PodSpec(node_name=on, containers=[client.V1Container(
            name="c", resources=client.V1ResourceRequirements(
                requests={"cpu": cpu, "memory": memory}, limits=limits))]),
        status=client.V1PodStatus(phase=phase))


def test_free_is_allocatable_less_what_running_pods_ask() -> None:
    nodes = [node("cpu-1", "2", "8Gi"),
             node("gpu-1", "4", "16Gi", "2", {"skypilot.co/accelerator": "a100"})]
    pods = [pod("cpu-1", "500m", "1Gi"), pod("gpu-1", "1", "2Gi", "1"),
            pod("gpu-1", "3", "8Gi", "1", phase="Succeeded")]  # ended: takes nothing
    cpu, gpu = capacities(nodes, pods)
    assert (cpu.cpus, cpu.free_cpus, cpu.free_memory_gb, cpu.gpus) == (2, 1.5, 7, 0)
    assert (gpu.gpus, gpu.free_gpus, gpu.accelerator, gpu.free_cpus) == (2, 1, "A100", 3)
    assert gpu.holds(2, 4, 2, "a100") and not gpu.holds(2, 4, 3, "A100")
    assert not gpu.holds(1, 1, 1, "H100") and not cpu.holds(1, 1, 1, None)
    assert cpu.holds(2, 8, 0, None) and not cpu.holds(2.5, 1, 0, None)
    assert nearest([cpu, gpu], gpus=3) == [gpu, cpu]
    assert gpu.describe() == "gpu-1: 4 CPUs (3 free), 16.0 GB, 2 A100 (1 free)"


def test_gpu_models_from_the_labels_of_each_style() -> None:
    assert accelerator_name({"nvidia.com/gpu.product": "NVIDIA-A100-SXM4-80GB"}) == "A100"
    assert accelerator_name({"nvidia.com/gpu.product": "Tesla-T4"}) == "T4"
    assert accelerator_name({"skypilot.co/accelerator": "h100"}) == "H100"
    assert accelerator_name({"cloud.google.com/gke-accelerator": "nvidia-l4"}) == "L4"
    assert accelerator_name({"cloud.google.com/gke-accelerator": "nvidia-tesla-a100"}) == "A100"
    assert accelerator_name({"karpenter.k8s.aws/instance-gpu-name": "l40s"}) == "L40S"
    assert accelerator_name({}) is None


def test_pods_ask_for_what_the_task_asks_and_select_the_gpu_model() -> None:
    spec = PodSpec("duo-1a2b3c", "duo", "clusterd-abc", "img:1", "IfNotPresent",
                   "ssh-ed25519 AAAA key", cpus=2, memory_gb=8, gpus=1, accelerator="A100",
                   labels=(("team", "ml"),))
    head, worker = pod_manifest(spec, 0), pod_manifest(spec, 1)
    assert head["metadata"]["name"] == pod_name("duo-1a2b3c", 0) == "duo-1a2b3c-head"
    assert worker["metadata"]["name"] == "duo-1a2b3c-worker1"
    assert worker["metadata"]["labels"] == {
        "team": "ml", "clusterd-cluster-name": "duo-1a2b3c", "clusterd-managed-by": "clusterd-abc",
        "clusterd-cluster": "duo", "clusterd-node-role": "worker",
        "clusterd-pod": "duo-1a2b3c-worker1"}
    container = head["spec"]["containers"][0]
    assert container["resources"] == {
        "requests": {"cpu": "2", "memory": "8Gi", "nvidia.com/gpu": "1"},
        "limits": {"memory": "8Gi", "nvidia.com/gpu": "1"}}
    assert "nodeSelector" not in head["spec"]  # GPU nodes are chosen by gpu_selector
    assert head["spec"]["tolerations"] == [
        {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert container["env"] == [{"name": "CLUSTERD_SSH_PUBLIC_KEY",
                                 "value": "ssh-ed25519 AAAA key"},
                                {"name": "CLUSTERD_SSH_USER", "value": "sky"}]
    # clusterd's start script, not the image's entrypoint (which may be python3).
    assert container["command"][:2] == ["/bin/sh", "-c"]
    assert head["spec"]["restartPolicy"] == "Never"
    assert head["spec"]["automountServiceAccountToken"] is False
    cpu_only = pod_manifest(PodSpec("c-1", "c", "d", "img", "Never", "k", 0.5, 1.5), 0)
    assert "nodeSelector" not in cpu_only["spec"]
    assert "tolerations" not in cpu_only["spec"]
    assert "nodeAffinity" not in cpu_only["spec"]["affinity"]
    assert cpu_only["spec"]["containers"][0]["resources"]["requests"] == {
        "cpu": "0.5", "memory": "1.5Gi"}
