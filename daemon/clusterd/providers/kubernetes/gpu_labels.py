"""Which label names a node's GPU model, and how a pod selects nodes by it.

Clusters label GPU nodes in one of a few styles, and a pod must select by the label the nodes
actually carry: SkyPilot's own `skypilot.co/accelerator` (a100), NVIDIA's GPU feature
discovery `nvidia.com/gpu.product` (NVIDIA-A100-SXM4-80GB, Tesla-T4), GKE's
`cloud.google.com/gke-accelerator` (nvidia-tesla-a100, nvidia-l4) and Karpenter's
`karpenter.k8s.aws/instance-gpu-name` (a100, t4). The selector is made from the labels of the
nodes that hold the model asked for (one term per label key, ORed); where the nodes cannot be
read, or an autoscaler is to add them, from each style's usual spelling of the model.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

SKYPILOT = "skypilot.co/accelerator"
GFD = "nvidia.com/gpu.product"
GKE = "cloud.google.com/gke-accelerator"
KARPENTER = "karpenter.k8s.aws/instance-gpu-name"
# Most specific first: a node labelled in several styles is named by the first.
LABEL_KEYS = (SKYPILOT, GFD, GKE, KARPENTER)
# The taint GPU node pools carry (GKE adds it to every GPU pool; EKS and Karpenter setups
# commonly do): pods that ask for GPUs tolerate it.
GPU_TAINT = "nvidia.com/gpu"
GPU_TOLERATION = {"key": GPU_TAINT, "operator": "Exists", "effect": "NoSchedule"}

# Longer names first, so A100 is not read as A10, nor L40S as L4.
_MODEL = re.compile(r"(A100|A10G|A10|H100|H200|L40S|L40|L4|T4|V100|P100|P4|K80|B200|GH200)")
# GKE's spelling for the models it names nvidia-tesla-*; the rest are nvidia-<model>.
_GKE_TESLA = {"K80", "P100", "P4", "T4", "V100", "A100"}
_GKE_EXTRA = {"A100": ("nvidia-a100-80gb",), "H100": ("nvidia-h100-80gb",
                                                      "nvidia-h100-mega-80gb")}
# Which styles an autoscaler's new nodes carry (SkyPilot's `kubernetes.autoscaler` values).
AUTOSCALER_KEYS = {"gke": (GKE,), "karpenter": (KARPENTER, GFD), "coreweave": (GFD,),
                   "generic": LABEL_KEYS}


def model_of(value: str) -> str:
    """A label value as SkyPilot names the model (upper case): NVIDIA-A100-SXM4-80GB -> A100."""
    found = _MODEL.search(value.upper())
    return found.group(1) if found else value.upper()


def gpu_label(labels: Mapping[str, str]) -> tuple[str, str] | None:
    """The (key, value) that names the node's GPU model, in the first style it carries."""
    for key in LABEL_KEYS:
        value = labels.get(key)
        if value:
            return key, value
    return None


def guessed_values(key: str, model: str) -> tuple[str, ...]:
    """How a style usually spells a model, for nodes not seen (yet)."""
    upper, lower = model.upper(), model.lower()
    if key in (SKYPILOT, KARPENTER):
        return (lower,)
    if key == GKE:
        first = f"nvidia-tesla-{lower}" if upper in _GKE_TESLA else f"nvidia-{lower}"
        return (first, *_GKE_EXTRA.get(upper, ()))
    return (f"NVIDIA-{upper}", f"Tesla-{upper}")


@dataclasses.dataclass(frozen=True)
class GpuSelector:
    """Nodes with any of these label values (one term per key, ORed)."""

    terms: tuple[tuple[str, tuple[str, ...]], ...]

    def node_affinity(self) -> dict[str, Any]:
        return {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
            {"matchExpressions": [{"key": key, "operator": "In", "values": list(values)}]}
            for key, values in self.terms]}}

    def describe(self) -> str:
        return " or ".join(f"{key} in ({', '.join(values)})" for key, values in self.terms)


def selector(model: str, seen: Iterable[tuple[str, str]],
             keys: Iterable[str] = ()) -> GpuSelector:
    """The selector for `model`: the (key, value) labels of the nodes seen to hold it, plus
    the usual spelling under `keys` (the styles an autoscaler's new nodes carry, or every
    style when no node could be read)."""
    by_key: dict[str, set[str]] = {}
    for key, value in seen:
        if model_of(value) == model.upper():
            by_key.setdefault(key, set()).add(value)
    for key in keys:
        by_key.setdefault(key, set()).update(guessed_values(key, model))
    return GpuSelector(tuple((key, tuple(sorted(by_key[key])))
                             for key in LABEL_KEYS if key in by_key))


def selector_for(model: str, nodes_seen: Iterable[tuple[str, str]] | None,
                 autoscaler: str | None) -> GpuSelector:
    """The selector a pod asking for `model` gets. nodes_seen: the GPU labels of the
    context's nodes (None: they could not be read); with an autoscaler, the labels its new
    nodes will carry are added."""
    if nodes_seen is None:
        return selector(model, (), LABEL_KEYS)
    keys = AUTOSCALER_KEYS.get(autoscaler or "", ())
    found = selector(model, nodes_seen, keys)
    return found if found.terms else selector(model, (), LABEL_KEYS)
