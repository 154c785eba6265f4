"""Kubernetes benchmarks on the Kubernetes test bed (need root): a 2-node launch by phase
beside a local launch in the same run, the LIST calls one refresh of 100 clusters costs the
API server, and the bed's own build and warm `up`.

Run through `scripts/bench --only k8s_launch,k8s_refresh,k8s_bed`. The bed gets a namespace
and a directory of its own, and a daemon inside it; both go away at the end.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from typing import Any

from bench_bed import BedDaemon, insert_records, launch_beside_local, timed

CONTEXTS = ("bed-a", "bed-b")
# The API server's own count of requests, by verb and resource (its /metrics).
LIST_PODS = re.compile(r'^apiserver_request_total\{(?=[^}]*verb="LIST")'
                       r'(?=[^}]*resource="pods")[^}]*\} (\d+)', re.M)


class K8sBed(BedDaemon):
    kind = "k8s"

    def up_args(self) -> list[str]:
        return ["--nodes", "2", "--gpu-nodes", "1", "--runtime-image"]

    def daemon_env(self, bed_env: dict[str, str]) -> dict[str, str]:
        config = self.root / "config.yaml"
        config.write_text(
            "kubernetes:\n"
            f"  allowed_contexts: [{', '.join(CONTEXTS)}]\n"
            f"  image: {bed_env['CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE']}\n"
            "  image_pull_policy: Never\n")
        self.admin = bed_env["CLUSTERD_TESTBED_K8S_ADMIN_KUBECONFIG"]
        return {"KUBECONFIG": bed_env["KUBECONFIG"], "CLUSTERD_CONFIG": str(config),
                "PATH": bed_env["PATH"]}

    def kubectl(self, *args: str, stdin: str | None = None) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.netns, "kubectl", "--kubeconfig",
                               self.admin, *args], env=self.env, input=stdin,
                              capture_output=True, text=True, timeout=600)
        if done.returncode != 0:
            raise SystemExit(f"kubectl {' '.join(args)}: {done.stderr}")
        return done.stdout

    def list_pods_calls(self) -> int:
        """LIST requests for pods the API server has answered since it started."""
        return sum(int(n) for n in LIST_PODS.findall(self.kubectl("get", "--raw", "/metrics")))


def bench_k8s_launch(bench: Any, runs: int = 2) -> None:
    print("(p) launch of a 2-node Kubernetes cluster on the bed vs a local launch",
          file=sys.stderr)
    bed = K8sBed(bench)
    try:
        bed.up()
        launch_beside_local(bench, bed, "k8s_launch_2_nodes", "kubernetes/bed-a", runs, "1")
    finally:
        bed.down()


def _pending_pods(managed_by: str, made: list[tuple[str, str]]) -> str:
    """Pods of the inserted clusters that the scheduler never places (no node has the label
    asked for): real objects for the refresh to list, at no cost to the machine."""
    items = [{
        "apiVersion": "v1", "kind": "Pod",
        "metadata": {"name": f"{cloud_name}-head", "namespace": context, "labels": {
            "clusterd-cluster-name": cloud_name, "clusterd-managed-by": managed_by,
            "clusterd-node-role": "head"}},
        "spec": {"nodeSelector": {"clusterd-bench": "nowhere"},
                 "containers": [{"name": "node", "image": "none"}]},
    } for cloud_name, context in made]
    return json.dumps({"apiVersion": "v1", "kind": "List", "items": items})


def bench_k8s_refresh(bench: Any, clusters: int = 100) -> None:
    print(f"(q) one refresh of {clusters} Kubernetes clusters in 2 contexts: pod LIST calls",
          file=sys.stderr)
    bed = K8sBed(bench)
    try:
        bed.up()
        managed_by = (bed.state_dir / "daemon-id").read_text().strip()
        made = [(f"kref-{i:03d}-x", CONTEXTS[i % 2]) for i in range(clusters)]
        if bed._testbed("quota", "--pods", str(clusters)).returncode != 0:  # bed-b's: 20
            raise SystemExit("cannot raise bed-b's pod quota")
        bed.kubectl("apply", "-f", "-", stdin=_pending_pods(managed_by, made))
        bed.stop_daemon()
        insert_records(bed.state_dir / "state.db", "kubernetes", "UP", [
            (cloud_name, {"infra": f"kubernetes/{context}"},
             {"provider": "kubernetes", "region": context, "cpus": 1},
             {"provider": {"context": context, "namespace": context,
                           "pods": [{"name": f"{cloud_name}-head"}]}})
            for cloud_name, context in made])
        bed.start_daemon()
        bed.ctl("status", "--refresh")  # settles the inserted records once
        before = bed.list_pods_calls()
        wall, done = timed(lambda: bed.ctl("status", "--refresh", "--json"))
        calls = bed.list_pods_calls() - before
        listed = [c for c in json.loads(done.stdout) if c["provider"] == "kubernetes"]
        bench.record("k8s_refresh_100_list_calls_per_context", calls / len(CONTEXTS), "calls",
                     target="= 1 per context", ok=calls == len(CONTEXTS)
                     and len(listed) == clusters, list_calls=calls,
                     contexts=len(CONTEXTS), refresh_s=round(wall, 2))
    finally:
        bed.down()


def bench_k8s_bed(bench: Any) -> None:
    """The bed's build (cold: only when the cache lacks this version; else the time of the
    cached run says so) and a warm `up` and `down`."""
    print("(r) the Kubernetes bed: first up (builds if uncached), then a warm up", file=sys.stderr)
    bed = K8sBed(bench)
    try:
        first, done = timed(lambda: bed._testbed("up", "--netns", bed.netns))
        if done.returncode != 0:
            raise SystemExit(f"k8s bed up failed: {done.stderr}")
        built = "building" in (done.stdout + done.stderr).lower()
        down, _ = timed(lambda: bed._testbed("down"))
        warm, done = timed(lambda: bed._testbed("up", "--netns", bed.netns))
        if done.returncode != 0:
            raise SystemExit(f"k8s bed up failed: {done.stderr}")
        bench.record("k8s_bed_warm_up", warm, "s", baseline=first,
                     baseline_name="first up" + (" (built Kubernetes)" if built else
                                                 " (cache warm too)"),
                     down_s=round(down, 1))
    finally:
        bed._testbed("down")
