"""`scripts/testbed k8s kill-node | restart-apiserver`: losing a node (every process of it
dies at once, as when its machine goes) and restarting the API server (every watch, exec and
port-forward through it is cut). Standard library only."""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from typing import Any

from _testbed.common import Failure, log
from _testbed.k8s import components, host, nodes
from _testbed.k8s.commands import admin_api, bed_lock, wait_component
from _testbed.k8s.layout import BedPaths, load_state, save_state

RESTART_GRACE_S = 2.0


def require_bed(paths: BedPaths) -> dict[str, Any]:
    state = load_state(paths) if os.path.isdir(paths.dir) else None
    if state is None:
        raise Failure(f"no Kubernetes test bed in {paths.dir}", hint="scripts/testbed k8s up")
    if not components.is_ours(state["procs"].get("controller"), paths):
        raise Failure(f"the Kubernetes test bed in {paths.dir} is broken: its controller is "
                      f"not running", hint="`scripts/testbed k8s up` starts what is missing")
    return state


def cmd_kill_node(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    with contextlib.ExitStack() as stack:
        lock = bed_lock(paths)
        if lock is not None:
            stack.callback(os.close, lock)
        state = require_bed(paths)
        node = state["nodes"].get(args.name)
        if node is None:
            raise Failure(f"no node {args.name} in the bed",
                          hint=f"its nodes: {', '.join(state['nodes']) or 'none'}")
        procs = nodes.processes(node.get("pid"))
        if not nodes.kill(node.get("pid"), paths, args.name):
            raise Failure(f"node {args.name} is down already",
                          hint="`scripts/testbed k8s up` boots it again")
        host.remove_cgroups(state["netns"], args.name)
        node["killed_at"] = time.time()
        save_state(paths, state)
        if args.forget:
            admin_api(paths).call("DELETE", f"/api/v1/nodes/{args.name}")
    log(f"node {args.name} lost: its kubelet (pid {procs.get('kubelet', '?')}), containerd "
        f"and every pod's processes are gone; the API server marks it NotReady within about "
        f"{components.NODE_GRACE} and evicts its pods {components.TOLERATION_S}s later"
        + (" (its Node object is deleted: its pods go with it)" if args.forget else "")
        + "; `scripts/testbed k8s up` boots it again")
    return 0


def cmd_restart_apiserver(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    lock = bed_lock(paths)
    try:
        state = require_bed(paths)
        t = time.monotonic()
        # Its graceful stop waits for open watches and tunnels, which never end: after 2 s
        # it is killed, as a crashed or upgraded API server would drop them.
        components.stop(state["procs"].get("apiserver"), paths, wait_s=RESTART_GRACE_S)
        pid = components.start("apiserver", paths, state["netns"],
                               os.path.join(state["cache"], "bin"),
                               min(state["nodes"] or ["cpu-1"]))
        state["procs"]["apiserver"] = pid
        save_state(paths, state)
        wait_component("apiserver", pid, paths, admin_api(paths))
    finally:
        if lock is not None:
            os.close(lock)
    log(f"API server restarted (pid {pid}): it answered again after "
        f"{time.monotonic() - t:.1f}s; connections through it (watches, port-forwards, exec) "
        f"were cut")
    return 0
