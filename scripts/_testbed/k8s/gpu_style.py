"""`scripts/testbed k8s gpu-style STYLE`: label and taint the bed's GPU nodes the way one kind
of real cluster does, so clusterd is shown each: `gke` (GKE's node pools:
cloud.google.com/gke-accelerator=nvidia-tesla-a100 and the nvidia.com/gpu=present:NoSchedule
taint GKE puts on every GPU pool), `gfd` (NVIDIA's GPU feature discovery:
nvidia.com/gpu.product=NVIDIA-A100-SXM4-80GB, tainted), `karpenter` (Karpenter's
karpenter.k8s.aws/instance-gpu-name=a100, tainted), `skypilot` (SkyPilot's
skypilot.co/accelerator=a100, tainted) and `bed` (what `up` makes: SkyPilot's and GFD's labels,
no taint). Every other style's label is removed. Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os

from _testbed.common import Failure, log
from _testbed.k8s.commands import admin_api
from _testbed.k8s.layout import GPU_LABELS, GPU_NAME, GPU_PRODUCT, BedPaths
from _testbed.k8s.operations import require_bed

GKE_LABEL = "cloud.google.com/gke-accelerator"
KARPENTER_LABEL = "karpenter.k8s.aws/instance-gpu-name"
SKYPILOT_LABEL = "skypilot.co/accelerator"
GFD_LABEL = "nvidia.com/gpu.product"
TAINT = {"key": "nvidia.com/gpu", "value": "present", "effect": "NoSchedule"}
STYLES: dict[str, tuple[dict[str, str], bool]] = {
    "bed": (dict(GPU_LABELS), False),
    "gke": ({GKE_LABEL: f"nvidia-tesla-{GPU_NAME.lower()}"}, True),
    "gfd": ({GFD_LABEL: GPU_PRODUCT, "nvidia.com/gpu.count": GPU_LABELS["nvidia.com/gpu.count"]},
            True),
    "karpenter": ({KARPENTER_LABEL: GPU_NAME.lower()}, True),
    "skypilot": ({SKYPILOT_LABEL: GPU_NAME.lower()}, True),
}
ALL_LABELS = sorted({key for labels, _ in STYLES.values() for key in labels})


def cmd_gpu_style(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    state = require_bed(paths)
    labels, tainted = STYLES[args.style]
    api = admin_api(paths)
    gpu_nodes = sorted(name for name, node in state["nodes"].items() if node.get("gpus"))
    if not gpu_nodes:
        raise Failure("the bed has no GPU node", hint="scripts/testbed k8s up --gpu-nodes 1")
    for name in gpu_nodes:
        node = json.loads(api.ok("GET", f"/api/v1/nodes/{name}"))
        taints = [t for t in node["spec"].get("taints") or [] if t["key"] != TAINT["key"]]
        if tainted:
            taints.append(TAINT)
        patch = {"metadata": {"labels": {key: labels.get(key) for key in ALL_LABELS}},
                 "spec": {"taints": taints or None}}
        api.ok("PATCH", f"/api/v1/nodes/{name}", json.dumps(patch),
               "application/merge-patch+json")
    log(f"GPU node(s) {', '.join(gpu_nodes)} labelled in the {args.style} style: "
        + ", ".join(f"{k}={v}" for k, v in labels.items())
        + (f"; tainted {TAINT['key']}={TAINT['value']}:{TAINT['effect']}" if tainted
           else "; no taint"))
    return 0
