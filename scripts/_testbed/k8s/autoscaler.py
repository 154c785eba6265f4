"""`scripts/testbed k8s autoscaler [--boot-delay S] NODE...`: a cluster autoscaler, as far as a
cluster's users can tell one. The NODEs are the node pool it may add: they are cordoned first
(not there yet), and each time a pod waits unschedulable, the autoscaler posts the event
cluster-autoscaler posts (TriggeredScaleUp) and, after S seconds (a new machine boots and its
kubelet registers), "adds" the next node of the pool by uncordoning it. It runs in the
foreground until the pool is used up (or SIGTERM/SIGINT, which adds what is left: the bed is
as it was). Standard library only.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from typing import Any

from _testbed.common import Failure, log
from _testbed.k8s import components
from _testbed.k8s.commands import admin_api
from _testbed.k8s.layout import BedPaths
from _testbed.k8s.operations import require_bed

POLL_S = 0.5


def _cordon(api: components.Api, name: str, on: bool) -> None:
    api.ok("PATCH", f"/api/v1/nodes/{name}", json.dumps({"spec": {"unschedulable": on}}),
           "application/merge-patch+json")


def _unschedulable(api: components.Api) -> list[dict[str, Any]]:
    text = api.ok("GET", "/api/v1/pods?fieldSelector=status.phase%3DPending")
    return [pod for pod in json.loads(text)["items"]
            if any(c.get("type") == "PodScheduled" and c.get("status") == "False"
                   and c.get("reason") == "Unschedulable"
                   for c in pod.get("status", {}).get("conditions") or [])]


def _event(api: components.Api, pod: dict[str, Any], reason: str, message: str) -> None:
    meta = pod["metadata"]
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    api.ok("POST", f"/api/v1/namespaces/{meta['namespace']}/events", {
        "apiVersion": "v1", "kind": "Event",
        "metadata": {"generateName": "clusterd-testbed-autoscaler-",
                     "namespace": meta["namespace"]},
        "involvedObject": {"kind": "Pod", "name": meta["name"],
                           "namespace": meta["namespace"], "uid": meta["uid"]},
        "reason": reason, "message": message, "type": "Normal",
        "source": {"component": "cluster-autoscaler"},
        "firstTimestamp": now, "lastTimestamp": now, "count": 1})


def cmd_autoscaler(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    state = require_bed(paths)
    unknown = [n for n in args.nodes if n not in state["nodes"]]
    if unknown:
        raise Failure(f"no node {unknown[0]} in the bed",
                      hint=f"its nodes: {', '.join(state['nodes'])}")
    api = admin_api(paths)
    pool = list(args.nodes)
    for name in pool:
        _cordon(api, name, True)
    stopping = False

    def stop(signum: int, frame: Any) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    # The line a caller waits for: from here, pods that need the pool wait for it.
    print(f"autoscaler: watching; pool {', '.join(pool)} held back", flush=True)
    seen: set[str] = set()
    waiting_since: float | None = None
    try:
        while pool and not stopping:
            pending = [p for p in _unschedulable(api) if p["metadata"]["uid"] not in seen]
            for pod in pending:
                seen.add(pod["metadata"]["uid"])
                _event(api, pod, "TriggeredScaleUp",
                       f"pod triggered scale-up: [{{bed-pool {len(args.nodes) - len(pool)}->"
                       f"{len(args.nodes) - len(pool) + 1} (max: {len(args.nodes)})}}]")
                log(f"autoscaler: pod {pod['metadata']['namespace']}/"
                    f"{pod['metadata']['name']} is unschedulable: adding a node")
                if waiting_since is None:
                    waiting_since = time.monotonic()
            if waiting_since is not None and \
                    time.monotonic() - waiting_since >= args.boot_delay:
                name = pool.pop(0)
                _cordon(api, name, False)
                print(f"autoscaler: added {name}", flush=True)
                waiting_since = None
                seen.clear()  # still unschedulable after this node: another one
            time.sleep(POLL_S)
    finally:
        for name in pool:  # the bed as it was
            _cordon(api, name, False)
    print("autoscaler: done", flush=True)
    sys.stdout.flush()
    return 0
