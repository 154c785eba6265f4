"""Kubernetes clusters end to end on the Kubernetes test bed: upstream Kubernetes (API server,
scheduler, controller-manager, kubelets with containerd) in a network namespace with no link
out; the daemon and clusterctl run inside it too. Nothing is mocked: the provider speaks to the
API server over HTTPS with kubernetes-asyncio, reaches each pod's sshd through a port-forward
the API server carries (or a NodePort), and Ray and the agent run in the pods."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.k8sbed import LABEL_CLOUD_NAME, K8sBed
from tests.support import (
    CLUSTERCTL,
    Daemon,
    cloud_name,
    managed_job,
    managed_job_log,
    running,
    wait_for,
)

pytestmark = [pytest.mark.k8s, pytest.mark.ray]

CONFIG = """
kubernetes:
  allowed_contexts: [bed-b, bed-a]
  image: {image}
  image_pull_policy: Never
  provision_timeout: 5
  networking_mode: {mode}
"""


def config(bed: K8sBed, mode: str = "portforward") -> str:
    return CONFIG.format(image=bed.image, mode=mode)


@pytest.fixture(scope="module")
def daemon(k8s: K8sBed) -> Iterator[Daemon]:
    with running(k8s.daemon("cdk8d-", config(k8s), CLUSTERD_AGENT_AUTOSTOP_GRACE="5")) as d:
        yield d


def launch(daemon: Daemon, cluster: str, task: str, *args: str,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    (daemon.root / f"{cluster}.yaml").write_text(task)
    return daemon.ctl("launch", "-c", cluster, f"{cluster}.yaml", *args, timeout=timeout)


def by_role(pods: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Head first, then workers by name."""
    return sorted(pods, key=lambda p: (p["metadata"]["labels"]["clusterd-node-role"] != "head",
                                       p["metadata"]["name"]))


DUO = """
name: duo
num_nodes: 2
resources:
  infra: kubernetes/bed-a
  cpus: 1
  memory: 1
  labels: {team: e2e}
run: |
  echo "rank=$SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES ips=$(echo $SKYPILOT_NODE_IPS) as $(whoami)"
  echo "info=$SKYPILOT_CLUSTER_INFO"
"""


@pytest.fixture(scope="module")
def duo(k8s: K8sBed, daemon: Daemon) -> dict[str, Any]:
    result = launch(daemon, "duo", DUO)
    assert result.returncode == 0, result.stderr + daemon.log()[-4000:]
    for phase in ("creating nodes on kubernetes/bed-a", "starting Ray on 2",
                  "cluster duo is UP"):
        assert phase in result.stderr, phase
    pods = by_role(k8s.pods(cloud_name(daemon, "duo")))
    return {"result": result, "pods": pods}


def test_two_pods_on_two_nodes_run_one_ray_cluster(k8s: K8sBed, daemon: Daemon,
                                                   duo: dict[str, Any]) -> None:
    pods = duo["pods"]
    assert [p["metadata"]["labels"]["clusterd-node-role"] for p in pods] == ["head", "worker"]
    assert all(p["metadata"]["namespace"] == "bed-a" for p in pods)
    assert all(p["metadata"]["labels"]["team"] == "e2e" for p in pods)
    assert len({p["spec"]["nodeName"] for p in pods}) == 2, "one node holds both pods"
    container = pods[0]["spec"]["containers"][0]
    assert container["resources"]["requests"] == {"cpu": "1", "memory": "1Gi",
                                                  "ephemeral-storage": "4Gi"}
    assert not any("PRIVATE" in e["value"] for e in container["env"])
    ips = " ".join(p["status"]["podIP"] for p in pods)
    info = {"cluster_name": "duo", "cloud": "Kubernetes", "region": "bed-a", "zone": None,
            "num_nodes": 2}
    lines = sorted(duo["result"].stdout.splitlines())
    assert lines == sorted([
        f"(head, rank=0) rank=0 of 2 ips={ips} as sky",
        f"(head, rank=0) info={json.dumps(info)}",
        f"(worker1, rank=1) rank=1 of 2 ips={ips} as sky",
        f"(worker1, rank=1) info={json.dumps(info)}",
    ]), duo["result"].stdout
    row = daemon.cluster("duo")
    assert row is not None and row["status"] == "UP"
    assert row["infra"] == "kubernetes/bed-a", row


def test_exec_and_logs_reach_the_pods(daemon: Daemon, duo: dict[str, Any]) -> None:
    done = daemon.ctl("exec", "duo", "--num-nodes", "2", "--",
                      "echo hello from $SKYPILOT_NODE_RANK; hostname")
    assert done.returncode == 0, done.stderr
    names = [p["metadata"]["name"] for p in duo["pods"]]
    assert sorted(done.stdout.splitlines()) == sorted(
        ["(head, rank=0) hello from 0", f"(head, rank=0) {names[0]}",
         "(worker1, rank=1) hello from 1", f"(worker1, rank=1) {names[1]}"])
    logs = daemon.ctl("logs", "duo")
    assert logs.returncode == 0 and "hello from 1" in logs.stdout, logs.stderr


def test_stop_is_refused_and_autostop_means_down(daemon: Daemon, duo: dict[str, Any]) -> None:
    stop = daemon.ctl("stop", "-y", "duo")
    assert stop.returncode == 1
    assert "cannot be stopped" in stop.stderr and "clusterctl down duo" in stop.stderr
    set_ = daemon.ctl("autostop", "duo", "-i", "30")
    assert set_.returncode == 0, set_.stderr
    events = daemon.ctl("events", "duo").stdout
    assert "autostop set: tear down after 30 idle min" in events, events
    assert daemon.ctl("autostop", "duo", "--cancel").returncode == 0


def test_refresh_names_a_lost_pod_and_launch_repairs_it(
        k8s: K8sBed, daemon: Daemon, duo: dict[str, Any]) -> None:
    worker = duo["pods"][1]["metadata"]["name"]
    k8s.kubectl("delete", "pod", "-n", "bed-a", worker, "--grace-period=0", "--force")

    def init() -> dict[str, Any] | None:
        done = daemon.ctl("status", "--refresh", "--json")
        row = next(c for c in json.loads(done.stdout) if c["name"] == "duo")
        return row if row["status"] == "INIT" else None

    row = wait_for(init, 120, "duo to be INIT", interval=2)
    assert worker in row["status_reason"], row
    again = launch(daemon, "duo", DUO)
    assert again.returncode == 0, again.stderr + daemon.log()[-3000:]
    assert "rank=1 of 2" in again.stdout
    pods = k8s.pods(cloud_name(daemon, "duo"))
    assert len(pods) == 2 and all(p["status"]["phase"] == "Running" for p in pods)


def test_down_leaves_no_pod_service_or_secret(k8s: K8sBed, daemon: Daemon,
                                              duo: dict[str, Any]) -> None:
    name = cloud_name(daemon, "duo")
    done = daemon.ctl("down", "-y", "duo")
    assert done.returncode == 0, done.stderr
    assert k8s.leftovers(name) == []


GPU = """
resources:
  infra: kubernetes
  accelerators: A100:1
  cpus: 0.5
  memory: 1
run: echo gpus=$SKYPILOT_NUM_GPUS_PER_NODE
"""


def test_a_gpu_task_lands_on_the_gpu_node_with_the_gpu_in_its_limits(
        k8s: K8sBed, daemon: Daemon) -> None:
    k8s.ok("quota", "--pods", "0")  # bed-b first in the list: out of the way
    try:
        result = launch(daemon, "gpu", GPU)
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "gpus=1" in result.stdout
        (pod,) = k8s.pods(cloud_name(daemon, "gpu"))
        assert pod["spec"]["nodeName"] == "gpu-1"
        limits = pod["spec"]["containers"][0]["resources"]["limits"]
        assert limits["nvidia.com/gpu"] == "1"
        # The bed's GPU node carries SkyPilot's label and GFD's: either selects it.
        terms = pod["spec"]["affinity"]["nodeAffinity"][
            "requiredDuringSchedulingIgnoredDuringExecution"]["nodeSelectorTerms"]
        assert terms == [
            {"matchExpressions": [{"key": "skypilot.co/accelerator", "operator": "In",
                                   "values": ["a100"]}]}]
        # Failover from bed-b (its quota used up) to bed-a, with the reason in the table.
        assert "kubernetes/bed-b" in result.stderr and "exceeded quota" in result.stderr
    finally:
        daemon.ctl("down", "-y", "gpu")
        k8s.ok("quota", "--pods", "20")


def test_more_gpus_than_any_node_has_fails_at_once_naming_the_nearest(
        k8s: K8sBed, daemon: Daemon) -> None:
    started = time.monotonic()
    result = launch(daemon, "big", GPU.replace("A100:1", "A100:8"), timeout=120)
    assert result.returncode != 0
    assert time.monotonic() - started < 60
    assert "nearest" in result.stderr and "gpu-1" in result.stderr, result.stderr
    assert daemon.cluster("big") is None or daemon.ctl("down", "-y", "big").returncode == 0


ONE = """
resources:
  infra: kubernetes/bed-a
  cpus: 0.5
  memory: 1
run: echo one on $(hostname)
"""


HOLD = "clusterd-test/hold=yes"


def test_a_daemon_killed_mid_launch_leaves_one_set_of_pods(k8s: K8sBed) -> None:
    nodes = [n["metadata"]["name"]
             for n in json.loads(k8s.kubectl("get", "nodes", "-o", "json"))["items"]]
    with running(k8s.daemon("cdk8k-", config(k8s))) as daemon:
        (daemon.root / "pair.yaml").write_text(ONE.replace("resources:", "num_nodes: 2\n"
                                                                          "resources:"))
        # Killed right after the pods' handle is recorded, with no node that takes them (a
        # taint the pods do not tolerate): the next daemon's launch finds them Pending,
        # without addresses.
        daemon.stop()
        daemon.start(extra_env={"CLUSTERD_TEST_FAULTS": "launch.waiting"})
        for node in nodes:
            k8s.kubectl("taint", "nodes", node, f"{HOLD}:NoSchedule")
        try:
            killed = daemon.ctl("launch", "-c", "pair", "pair.yaml", timeout=300)
            assert killed.returncode != 0
            daemon.process.wait(timeout=30)  # type: ignore[union-attr]
            daemon.start()
            name = cloud_name(daemon, "pair")
            assert [p["status"]["phase"] for p in k8s.pods(name)] == ["Pending", "Pending"]
            again = subprocess.Popen(
                [*daemon.wrap, CLUSTERCTL, "launch", "-c", "pair", "pair.yaml"],
                env=daemon.env, cwd=daemon.root, stdout=subprocess.PIPE,
                stderr=subprocess.PIPE, text=True)
            assert again.stderr is not None
            seen = []
            for line in again.stderr:
                seen.append(line)
                if "waiting for the nodes of pair" in line:
                    break
        finally:
            for node in nodes:
                k8s.kubectl("taint", "nodes", node, f"{HOLD}:NoSchedule-")
        _, err = again.communicate(timeout=900)
        assert again.returncode == 0, "".join(seen) + err + daemon.log()[-3000:]
        pods = k8s.pods(name)
        assert sorted(p["metadata"]["name"] for p in pods) == [f"{name}-head",
                                                                f"{name}-worker1"]
        done = daemon.ctl("exec", "pair", "--", "echo after the kill", timeout=300)
        assert done.returncode == 0 and "after the kill" in done.stdout, done.stderr
        assert daemon.ctl("down", "-y", "pair").returncode == 0
        assert k8s.leftovers(name) == []


def test_exec_reopens_the_port_forward_after_the_api_server_restarts(
        k8s: K8sBed, daemon: Daemon) -> None:
    result = launch(daemon, "pf", ONE)
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
    try:
        k8s.ok("restart-apiserver")
        done = daemon.ctl("exec", "pf", "--", "echo after the restart", timeout=300)
        assert done.returncode == 0, done.stderr + daemon.log()[-3000:]
        assert "after the restart" in done.stdout
    finally:
        daemon.ctl("down", "-y", "pf")


def test_nodeport_networking(k8s: K8sBed) -> None:
    with running(k8s.daemon("cdk8n-", config(k8s, "nodeport"))) as daemon:
        result = launch(daemon, "np", ONE)
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "one on" in result.stdout
        name = cloud_name(daemon, "np")
        (service,) = k8s.objects("services", name)
        assert service["spec"]["type"] == "NodePort"
        port = service["spec"]["ports"][0]["nodePort"]
        (pod,) = k8s.pods(name)
        # The daemon reached the pod at its node's address and the Service's node port.
        assert f"sky@{pod['status']['hostIP']}:{port}" in result.stderr
        assert daemon.ctl("down", "-y", "np").returncode == 0
        assert k8s.leftovers(name) == []


def test_api_errors_are_retried_adopted_or_failed_over(k8s: K8sBed, daemon: Daemon) -> None:
    """429 and 500 are retried, a 409 on create is a pod there already, and RBAC's 403 in one
    context moves the launch to the next."""
    k8s.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "429",
           "--count", "1")
    k8s.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "500",
           "--count", "1")
    k8s.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "409",
           "--count", "1")
    k8s.ok("fault", "add", "--verb", "create", "--resource", "pods", "--code", "403",
           "--namespace", "bed-b")
    try:
        result = launch(daemon, "flaky", ONE.replace("kubernetes/bed-a", "kubernetes"))
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        rules = json.loads(k8s.ok("fault", "list", "--json"))["rules"]
        assert [r["fired"] for r in rules][:3] == [1, 1, 1], rules
        tried = [line for line in result.stderr.splitlines() if " — " in line]
        assert len(tried) == 1 and "kubernetes/bed-b" in tried[0] and "Forbidden" in tried[0]
        assert daemon.cluster("flaky")["infra"] == "kubernetes/bed-a"  # type: ignore[index]
    finally:
        k8s.ok("fault", "clear")
        daemon.ctl("down", "-y", "flaky")


BUSY = """
resources:
  ordered:
    - infra: kubernetes/bed-a
      accelerators: A100:1
      cpus: 0.5
      memory: 1
    - infra: kubernetes/bed-a
      cpus: 0.5
      memory: 1
run: echo gpus=$SKYPILOT_NUM_GPUS_PER_NODE
"""


def test_busy_gpus_leave_a_pod_pending_then_failover_says_why(k8s: K8sBed,
                                                              daemon: Daemon) -> None:
    hog = launch(daemon, "hog", GPU.replace("A100:1", "A100:2").replace(
        "infra: kubernetes", "infra: kubernetes/bed-a"))
    assert hog.returncode == 0, hog.stderr + daemon.log()[-3000:]
    try:
        result = launch(daemon, "busy", BUSY)
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        tried = [line for line in result.stderr.splitlines() if " — " in line]
        assert len(tried) == 1, result.stderr
        assert "could not be scheduled within 5 s" in tried[0]
        assert "Insufficient nvidia.com/gpu" in tried[0], tried[0]
        assert "gpus=0" in result.stdout
        (pod,) = k8s.pods(cloud_name(daemon, "busy"))
        assert "nvidia.com/gpu" not in pod["spec"]["containers"][0]["resources"]["limits"]
    finally:
        daemon.ctl("down", "-y", "busy")
        daemon.ctl("down", "-y", "hog")


def test_a_lost_node_makes_the_cluster_init_and_launch_repairs_it(
        k8s: K8sBed, daemon: Daemon) -> None:
    two = ONE.replace("resources:", "num_nodes: 2\nresources:")
    result = launch(daemon, "kn", two)
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
    name = cloud_name(daemon, "kn")
    head, worker = by_role(k8s.pods(name))
    lost = worker["spec"]["nodeName"]
    assert head["spec"]["nodeName"] != lost
    try:
        k8s.ok("kill-node", lost)

        def init() -> dict[str, Any] | None:
            done = daemon.ctl("status", "--refresh", "--json")
            row = next(c for c in json.loads(done.stdout) if c["name"] == "kn")
            return row if row["status"] == "INIT" else None

        row = wait_for(init, 180, "kn to be INIT", interval=2)
        assert f"its node {lost} stopped reporting" in row["status_reason"], row
        again = launch(daemon, "kn", two)
        assert again.returncode == 0, again.stderr + daemon.log()[-3000:]
        pods = by_role(k8s.pods(name))
        assert [p["metadata"]["name"] for p in pods] == [f"{name}-head", f"{name}-worker1"]
        assert pods[1]["spec"]["nodeName"] != lost
        assert pods[1]["metadata"]["uid"] != worker["metadata"]["uid"]
        assert daemon.cluster("kn")["status"] == "UP"  # type: ignore[index]
    finally:
        daemon.ctl("down", "-y", "kn")
        k8s.ok("up", timeout=600)  # the node boots again, for what follows


def test_the_label_selects_only_this_daemons_pods(k8s: K8sBed, daemon: Daemon) -> None:
    """Nothing of the tests above stays: every pod the bed holds is someone else's."""
    listed = json.loads(k8s.kubectl("get", "pods", "-A", "-o", "json"))
    ours = [p["metadata"]["name"] for p in listed["items"]
            if LABEL_CLOUD_NAME in (p["metadata"].get("labels") or {})]
    assert ours == []


def test_check_lists_the_contexts_and_show_gpus_the_nodes(k8s: K8sBed, daemon: Daemon) -> None:
    check = daemon.ctl("check", "--json")
    assert check.returncode == 0, check.stderr
    kube = json.loads(check.stdout)["providers"]["kubernetes"]
    assert kube["ok"] is True
    rows = {r["context"]: r for r in kube["contexts"]}
    assert list(rows) == ["bed-b", "bed-a"]
    assert rows["bed-a"]["ok"] and rows["bed-a"]["gpus"] == {"A100": 2}
    shown = daemon.ctl("show-gpus", "--infra", "kubernetes", "--json")
    assert shown.returncode == 0, shown.stderr
    gpus = json.loads(shown.stdout)
    assert {(r["region"], r["node"], r["accelerator"], r["count"], r["free"])
            for r in gpus} == {("bed-a", "gpu-1", "A100", 2, 2), ("bed-b", "gpu-1", "A100", 2, 2)}
    table = daemon.ctl("show-gpus", "--infra", "kubernetes")
    assert table.stdout.splitlines()[0].split() == ["CONTEXT", "NODE", "ACCELERATOR", "TOTAL",
                                                    "FREE", "vCPUs", "MEMORY"]
    unknown = daemon.ctl("show-gpus", "--infra", "kubernetes", "H100")
    assert unknown.returncode == 1 and "known: A100" in unknown.stderr


@pytest.mark.timeout(1500)
def test_a_managed_job_whose_pod_is_deleted_is_recovered_in_new_pods(
        k8s: K8sBed, daemon: Daemon) -> None:
    task = ("resources:\n  infra: kubernetes/bed-a\n  cpus: 1\n  memory: 1\nrun: |\n"
            "  echo \"task=$SKYPILOT_TASK_ID attempt=$SKYPILOT_MANAGED_JOB_ATTEMPT\"\n"
            "  if [ \"$SKYPILOT_MANAGED_JOB_ATTEMPT\" = 1 ]; then sleep 900; fi\n")
    (daemon.root / "evicted.yaml").write_text(task)
    submitted = daemon.ctl("jobs", "launch", "-d", "-n", "evicted", "evicted.yaml")
    assert submitted.returncode == 0, submitted.stderr

    def managed() -> dict[str, Any]:
        return managed_job(daemon, "evicted")

    def log() -> str:
        return managed_job_log(daemon, "evicted")

    wait_for(lambda: "attempt=1" in log(), 900, "attempt 1 to print", interval=2)
    cluster = managed()["cluster"]
    first = cloud_name(daemon, cluster)
    (pod,) = k8s.pods(first)
    k8s.kubectl("delete", "pod", "-n", "bed-a", pod["metadata"]["name"], "--grace-period=0",
                "--force")
    wait_for(lambda: managed()["status"] in ("RECOVERING", "SUCCEEDED"), 120,
             "the job to be RECOVERING")
    done = wait_for(lambda: (j := managed())["status"] not in (
        "RUNNING", "RECOVERING", "STARTING") and j, 900, "the job to end", interval=2)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["recoveries"] == 1, done
    ids = [line.split() for line in log().splitlines() if line.startswith("task=")]
    assert [i[1] for i in ids] == ["attempt=1", "attempt=2"] and ids[0][0] == ids[1][0]
    assert daemon.cluster(cluster) is None
    assert k8s.leftovers(first) == []
    for kind in ("pods", "services", "secrets"):  # the cluster it recovered on is gone too
        left = json.loads(k8s.kubectl("get", kind, "-A", "-o", "json", "-l",
                                      f"clusterd-cluster={cluster}"))["items"]
        assert left == [], (kind, [o["metadata"]["name"] for o in left])
