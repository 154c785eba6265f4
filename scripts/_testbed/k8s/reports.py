"""`scripts/testbed k8s status | exec | env | fault ... | quota`: what the bed is and holds,
running things in it, and the requests to its controller. Standard library only."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import shutil
import time
from typing import Any

from _testbed.common import Failure, log
from _testbed.common.control import request
from _testbed.k8s import components, nodes
from _testbed.k8s.commands import admin_api
from _testbed.k8s.layout import (
    API_URL,
    APISERVER_URL,
    CONTEXTS,
    QUOTA_CONTEXT,
    QUOTA_NAME,
    BedPaths,
    bed_env,
    load_state,
    pause_image,
    removed_env,
    short_image,
)
from _testbed.k8s.operations import require_bed


def _paths(args: argparse.Namespace) -> BedPaths:
    return BedPaths(os.path.abspath(args.dir))


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        log("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def status(paths: BedPaths, state: dict[str, Any]) -> dict[str, Any]:
    """Everything `status --json` prints."""
    procs = {}
    for name in components.ORDER:
        pid = state["procs"].get(name)
        alive = components.is_ours(pid, paths)
        procs[name] = {"pid": pid, "alive": alive, "rss_kb": nodes.rss_kb(pid) if alive else None}
    cluster: dict[str, Any] = {"nodes": [], "pods": []}
    error = None
    try:
        cluster = admin_api(paths).cluster()
    except Failure as e:
        error = str(e)
    by_name = {n["name"]: n for n in cluster["nodes"]}
    node_rows = []
    for name, node in sorted(state["nodes"].items()):
        found = by_name.get(name, {})
        pids = nodes.processes(node.get("pid")) if nodes.is_node(node.get("pid"), paths, name) \
            else {}
        node_rows.append({
            "name": name, "ip": node["ip"], "gpus": node["gpus"],
            "running": bool(pids), "ready": bool(found.get("ready")),
            "ready_reason": found.get("ready_reason"), "labels": found.get("labels", {}),
            "capacity": found.get("capacity", {}), "allocatable": found.get("allocatable", {}),
            "taints": found.get("taints", []), "registered": bool(found),
            "node_pid": node.get("pid") if pids else None, "kubelet_pid": pids.get("kubelet"),
            "containerd_pid": pids.get("containerd"),
            "kubelet_rss_kb": nodes.rss_kb(pids.get("kubelet")),
            "containerd_rss_kb": nodes.rss_kb(pids.get("containerd"))})
    pods: dict[str, list[dict[str, Any]]] = {}
    for pod in cluster["pods"]:
        pods.setdefault(pod.pop("namespace"), []).append(pod)
    return {"dir": paths.dir, "netns": state["netns"], "api_server": API_URL,
            "api_server_direct": APISERVER_URL, "kubeconfig": paths.kubeconfig,
            "admin_kubeconfig": paths.admin_kubeconfig,
            "contexts": [{"name": c, "namespace": ns, "user": user,
                          "quota": QUOTA_NAME if c == QUOTA_CONTEXT else None}
                         for c, ns, user in CONTEXTS],
            "kubernetes": state.get("kubernetes"), "package_version": state.get("package_version"),
            "cache": state.get("cache"), "node_image": short_image(state["node_image"]),
            "pause_image": short_image(pause_image()),
            "runtime_image": short_image(state["runtime_image"]["name"])
            if state.get("runtime_image") else None,
            "processes": procs, "nodes": node_rows,
            "pods": pods, "api_error": error}


def cmd_status(args: argparse.Namespace) -> int:
    paths = _paths(args)
    state = load_state(paths) if os.path.isdir(paths.dir) else None
    if state is None:
        print(f"no Kubernetes test bed in {paths.dir}")
        return 2
    got = status(paths, state)
    down = [n for n, p in got["processes"].items() if not p["alive"]] + \
        [n["name"] for n in got["nodes"] if not n["running"]]
    if args.json:
        log(json.dumps(got, indent=2))
        return 1 if down else 0
    log(f"Kubernetes test bed in {paths.dir} (namespace {got['netns']}; "
        f"Kubernetes {got['kubernetes']}; API {got['api_server']})")
    log("  " + ", ".join(f"{n} {'pid ' + str(p['pid']) if p['alive'] else 'DOWN'}"
                         for n, p in got["processes"].items()))
    if got["api_error"]:
        log(f"  the API server does not answer: {got['api_error']}")
    _table([[n["name"], n["ip"], "Ready" if n["ready"] else "NotReady",
             "up" if n["running"] else "down", str(n["kubelet_pid"] or "-"),
             n["capacity"].get("nvidia.com/gpu", "-"), n["labels"].get("clusterd.testbed/pool",
                                                                          "-")]
            for n in got["nodes"]],
           ["NODE", "IP", "STATUS", "PROCESSES", "KUBELET", "GPUS", "POOL"])
    for namespace, pods in sorted(got["pods"].items()):
        log(f"  {namespace}: " + ", ".join(f"{p['name']} ({p['phase']}"
                                           f"{', deleting' if p['deleting'] else ''})"
                                           for p in pods))
    return 1 if down else 0


def cmd_exec(args: argparse.Namespace) -> int:
    paths = _paths(args)
    state = require_bed(paths)
    cmd = list(args.cmd)
    if cmd[:1] == ["--"]:
        cmd = cmd[1:]
    if not cmd:
        raise Failure("k8s exec needs a command: scripts/testbed k8s exec -- CMD ...")
    ip = shutil.which("ip") or "/usr/sbin/ip"
    os.execve(ip, [ip, "netns", "exec", state["netns"], *cmd], bed_env(paths, os.environ, state))


def cmd_env(args: argparse.Namespace) -> int:
    paths = _paths(args)
    env = bed_env(paths, os.environ, require_bed(paths))
    if args.json:
        log(json.dumps(env, indent=2, sort_keys=True))
        return 0
    for k in sorted(os.environ):
        if removed_env(k) and k not in env:
            log(f"unset {k}")
    for k, v in sorted(env.items()):
        if os.environ.get(k) != v:
            log(f"export {k}={shlex.quote(v)}")
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    paths = _paths(args)
    require_bed(paths)
    sock = paths.control_sock
    if args.fault_command == "add":
        spec = {"code": args.code, "verb": args.verb, "resource": args.resource,
                "namespace": args.namespace, "name": args.name, "count": args.count,
                "delay": args.delay, "message": args.message}
        rule = request(sock, "fault_add", rule={k: v for k, v in spec.items()
                                                 if v is not None})["rule"]
        log(rule["id"])
        return 0
    if args.fault_command == "list":
        rules: list[dict[str, Any]] = request(sock, "fault_list")["rules"]
        if args.json:
            log(json.dumps({"rules": rules}, indent=2))
        elif not rules:
            log("no fault rules")
        else:
            names = ("verb", "resource", "namespace", "name")
            _table([[r["id"], " ".join(f"{n}={r[n]}" for n in names if r.get(n)) or "every",
                     (str(r["code"]) if r["code"] else "forwarded")
                     + (f" after {r['delay']:g}s" if r["delay"] else ""),
                     "-" if r["count"] is None else str(r["count"]), str(r["fired"])]
                    for r in rules], ["ID", "MATCHES", "ANSWER", "COUNT", "FIRED"])
        return 0
    if args.fault_command == "remove":
        request(sock, "fault_remove", id=args.id)
        log(f"removed fault rule {args.id}")
        return 0
    n = request(sock, "fault_clear")["removed"]
    log(f"removed {n} fault rule(s)")
    return 0


QUOTA_SETTLE_TIMEOUT_S = 60.0


def _enforced_quota(api: Any, path: str) -> dict[str, Any]:
    """The quota once the quota controller has copied its spec into its status: admission
    enforces only `status.hard`, so right after a change pods would still pass the old rules.
    A cloud's quota was set long before a user's launch; waiting here makes the bed's the same."""
    deadline = time.monotonic() + QUOTA_SETTLE_TIMEOUT_S
    while True:
        quota: dict[str, Any] = json.loads(api.ok("GET", path))
        if (quota.get("status") or {}).get("hard") == quota["spec"]["hard"]:
            return quota
        if time.monotonic() > deadline:
            raise Failure(f"the quota controller did not take up {QUOTA_NAME}'s new limits in "
                          f"{QUOTA_SETTLE_TIMEOUT_S:.0f}s",
                          hint="is kube-controller-manager up? scripts/testbed k8s status")
        time.sleep(0.2)


def cmd_quota(args: argparse.Namespace) -> int:
    """Show or set the hard limits of the quota context's ResourceQuota."""
    paths = _paths(args)
    require_bed(paths)
    api = admin_api(paths)
    namespace = dict((c, n) for c, n, _ in CONTEXTS)[QUOTA_CONTEXT]
    path = f"/api/v1/namespaces/{namespace}/resourcequotas/{QUOTA_NAME}"
    hard: dict[str, str | None] = {
        k: str(v) for k, v in (("pods", args.pods), ("requests.nvidia.com/gpu", args.gpus),
                               ("limits.cpu", args.limits_cpu)) if v is not None}
    if hard.get("limits.cpu") == "none":
        hard["limits.cpu"] = None  # a merge patch's null removes it
    if hard:
        api.ok("PATCH", path, {"spec": {"hard": hard}}, "application/merge-patch+json")
    quota = _enforced_quota(api, path)
    got = {"context": QUOTA_CONTEXT, "namespace": namespace, "name": QUOTA_NAME,
           "hard": quota["spec"]["hard"], "used": (quota.get("status") or {}).get("used", {})}
    if args.json:
        log(json.dumps(got, indent=2))
    else:
        log(f"{QUOTA_NAME} in {namespace} (context {QUOTA_CONTEXT}): " + ", ".join(
            f"{k} {got['used'].get(k, '?')}/{v}" for k, v in sorted(got["hard"].items())))
    return 0
