"""What a Kubernetes cluster's nodes can hold: their allocatable CPUs, memory and GPUs (and the
GPU model, from whichever GPU label the node carries), less what the pods on them ask for. A
request that no node could ever hold is refused at once, naming the nearest nodes; one that
fits some node but not now waits for the scheduler (Pending), which is capacity, not an error.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

from clusterd.providers.kubernetes.gpu_labels import gpu_label, model_of
from clusterd.quantities import parse_quantity

GPU_RESOURCE = "nvidia.com/gpu"
GIB = 1024**3

def accelerator_name(labels: Mapping[str, str]) -> str | None:
    """The node's GPU model as SkyPilot names it (upper case: A100, H100, L4), if labelled
    (in any style gpu_labels knows)."""
    found = gpu_label(labels)
    return model_of(found[1]) if found else None


@dataclasses.dataclass(frozen=True)
class NodeCapacity:
    name: str
    ready: bool
    schedulable: bool
    cpus: float
    memory_gb: float
    gpus: float
    accelerator: str | None
    free_cpus: float
    free_memory_gb: float
    free_gpus: float
    # The label that names its GPU model, as the node carries it (what pods select by).
    gpu_label: tuple[str, str] | None = None

    def holds(self, cpus: float, memory_gb: float, gpus: float,
              accelerator: str | None) -> bool:
        """Whether a pod asking for this could ever run here (free or not)."""
        if accelerator and (self.accelerator or "").upper() != accelerator.upper():
            return False
        return cpus <= self.cpus and memory_gb <= self.memory_gb and gpus <= self.gpus

    def describe(self) -> str:
        gpus = f", {_n(self.gpus)} {self.accelerator or 'GPU'} ({_n(self.free_gpus)} free)" \
            if self.gpus else ""
        state = "" if self.ready and self.schedulable else " (not ready)"
        return (f"{self.name}: {_n(self.cpus)} CPUs ({_n(self.free_cpus)} free), "
                f"{self.memory_gb:.1f} GB{gpus}{state}")


def _n(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:.1f}"


def _requests(pod: Any) -> tuple[float, float, float]:
    cpus = memory = gpus = 0.0
    for container in (pod.spec.containers or []):
        resources = container.resources
        requests = dict((resources.requests if resources else None) or {})
        limits = dict((resources.limits if resources else None) or {})
        cpus += parse_quantity(requests.get("cpu", "0"))
        memory += parse_quantity(requests.get("memory", "0"))
        gpus += parse_quantity(limits.get(GPU_RESOURCE, requests.get(GPU_RESOURCE, "0")))
    return cpus, memory / GIB, gpus


def capacities(nodes: Iterable[Any], pods: Iterable[Any]) -> list[NodeCapacity]:
    """Each node's capacity, from the API's V1Node and V1Pod objects (pods of any namespace
    that the caller could list; pods that ended take nothing)."""
    used: dict[str, tuple[float, float, float]] = {}
    for pod in pods:
        if not pod.spec or not pod.spec.node_name or (pod.status and pod.status.phase in (
                "Succeeded", "Failed")):
            continue
        c, m, g = _requests(pod)
        was = used.get(pod.spec.node_name, (0.0, 0.0, 0.0))
        used[pod.spec.node_name] = (was[0] + c, was[1] + m, was[2] + g)
    out = []
    for node in nodes:
        allocatable = dict(node.status.allocatable or {})
        conditions = {c.type: c.status for c in (node.status.conditions or [])}
        cpus = parse_quantity(allocatable.get("cpu", "0"))
        memory = parse_quantity(allocatable.get("memory", "0")) / GIB
        gpus = parse_quantity(allocatable.get(GPU_RESOURCE, "0"))
        taken = used.get(node.metadata.name, (0.0, 0.0, 0.0))
        out.append(NodeCapacity(
            name=node.metadata.name,
            ready=conditions.get("Ready") == "True",
            schedulable=not node.spec.unschedulable,
            cpus=cpus, memory_gb=memory, gpus=gpus,
            accelerator=accelerator_name(node.metadata.labels or {}) if gpus else None,
            gpu_label=gpu_label(node.metadata.labels or {}) if gpus else None,
            free_cpus=max(0.0, cpus - taken[0]), free_memory_gb=max(0.0, memory - taken[1]),
            free_gpus=max(0.0, gpus - taken[2])))
    return out


def nearest(nodes: list[NodeCapacity], gpus: float, limit: int = 3) -> list[NodeCapacity]:
    """The nodes closest to holding the request: the most GPUs (when GPUs are asked), then
    the most CPUs and memory."""
    ranked = sorted(nodes, key=lambda n: (n.gpus if gpus else 0.0, n.cpus, n.memory_gb),
                    reverse=True)
    return ranked[:limit]
