"""AWS clusters end to end on the EC2 test bed: moto's API, and a real sshd "instance" behind
every running instance, all in a network namespace with only loopback; the daemon and
clusterctl run inside it too. No mock anywhere in the path: the provider makes its EC2 calls
over HTTP, the nodes are reached by SSH, Ray and the agent run on them."""

from __future__ import annotations

import dataclasses
import json
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.e2e.ec2bed import cloud_name as ec2_cloud_name
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray]

@dataclasses.dataclass
class Bed:
    ec2: EC2Bed
    daemon: Daemon

    def testbed(self, *args: str) -> subprocess.CompletedProcess[str]:
        return self.ec2.testbed(*args)

    def aws(self) -> dict[str, Any]:
        return self.ec2.aws()

    def instances(self, cloud_name: str) -> list[dict[str, Any]]:
        return self.ec2.instances(cloud_name)

    def nodes(self) -> list[dict[str, Any]]:
        return self.ec2.nodes()

    @property
    def netns(self) -> str:
        return self.ec2.netns

    @property
    def env(self) -> dict[str, str]:
        return self.ec2.env


def descendants(pid: int) -> list[int]:
    """pid and every process below it, from /proc."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            parent = int(stat[stat.rindex(")") + 2:].split()[1])
            children.setdefault(parent, []).append(int(entry.name))
    found, todo = [], [pid]
    while todo:
        current = todo.pop()
        found.append(current)
        todo += children.get(current, [])
    return found


def alive(pid: int) -> bool:
    """pid runs (a zombie, dead and waiting to be reaped, does not)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def cloud_name(bed: Bed, cluster: str) -> str:
    return ec2_cloud_name(bed.daemon, cluster)


@pytest.fixture(scope="module")
def bed(ec2: EC2Bed) -> Iterator[Bed]:
    with running(ec2.daemon("cdaws-", CLUSTERD_AGENT_AUTOSTOP_GRACE="5")) as daemon:
        yield Bed(ec2, daemon)


TASK = """
name: probe
num_nodes: 2
resources:
  cpus: 2
  ports: 8080
  labels: {team: e2e}
workdir: wd
run: |
  echo "rank=$SKYPILOT_NODE_RANK of $SKYPILOT_NUM_NODES as $(whoami) ips=$(echo $SKYPILOT_NODE_IPS)"
  cat data.txt
"""


@pytest.fixture(scope="module")
def duo(bed: Bed) -> str:
    (bed.daemon.root / "wd").mkdir(exist_ok=True)
    (bed.daemon.root / "wd" / "data.txt").write_text("data from the workdir\n")
    (bed.daemon.root / "task.yaml").write_text(TASK)
    result = bed.daemon.ctl("launch", "-c", "duo", "--infra", "aws/us-east-1", "task.yaml",
                            timeout=900)
    assert result.returncode == 0, result.stderr + bed.daemon.log()[-4000:]
    for phase in ("creating nodes on aws/us-east-1/", "installing the runtime",
                  "starting Ray on 2", "cluster duo is UP"):
        assert phase in result.stderr, phase
    instances = bed.instances(cloud_name(bed, "duo"))
    ips = " ".join(i["ip"] for i in sorted(instances, key=lambda i: i["tags"][
        "clusterd-node-role"] != "head"))
    assert sorted(result.stdout.splitlines()) == sorted([
        f"(head, rank=0) rank=0 of 2 as ubuntu ips={ips}",
        "(head, rank=0) data from the workdir",
        f"(worker1, rank=1) rank=1 of 2 as ubuntu ips={ips}",
        "(worker1, rank=1) data from the workdir"])
    return "duo"


def test_check_says_whose_credentials_and_which_regions(bed: Bed) -> None:
    result = bed.daemon.ctl("check", "--json")
    assert result.returncode == 0, result.stderr
    aws = json.loads(result.stdout)["providers"]["aws"]
    assert aws["ok"] and aws["identity"].startswith("arn:aws:")
    assert {"us-east-1", "us-west-2"} <= set(aws["regions"])


def test_show_gpus(bed: Bed) -> None:
    table = bed.daemon.ctl("show-gpus")
    assert table.returncode == 0 and "A100" in table.stdout and "H100" in table.stdout
    rows = json.loads(bed.daemon.ctl("show-gpus", "A100", "--json").stdout)
    p4d = next(r for r in rows if r["instance_type"] == "p4d.24xlarge")
    assert p4d["count"] == 8 and p4d["price"] > 10 and p4d["spot_price"] < p4d["price"]
    unknown = bed.daemon.ctl("show-gpus", "Z9000")
    assert unknown.returncode == 1 and "INVALID_ARGUMENT" in unknown.stderr


def test_a_two_node_cluster_is_tagged_and_opens_the_tasks_ports(bed: Bed, duo: str) -> None:
    name = cloud_name(bed, duo)
    instances = bed.instances(name)
    assert len(instances) == 2 and {i["state"] for i in instances} == {"running"}
    assert all(i["ip"].startswith("127.1.") for i in instances)
    assert sorted(i["tags"]["clusterd-node-role"] for i in instances) == ["head", "worker"]
    assert all(i["tags"]["team"] == "e2e" and i["tags"]["clusterd-cluster"] == duo
               for i in instances)
    groups = [g for g in bed.aws()["groups"] if g["tags"].get("clusterd-cluster-name") == name]
    assert len(groups) == 1 and [8080, 8080] in groups[0]["ports"]
    assert groups[0]["members_from"] == [groups[0]["id"]]  # the nodes reach each other
    status = bed.daemon.cluster(duo)
    assert status is not None and status["infra"].startswith("aws/us-east-1/")
    assert status["instance_type"] == "c6i.large" and status["price_per_hour"] > 0


def test_autostop_sets_what_a_shutdown_of_the_nodes_does(bed: Bed, duo: str) -> None:
    name = cloud_name(bed, duo)

    def behaviours() -> set[str]:
        return {n["shutdown_behavior"] for n in bed.nodes()
                if n["tags"].get("clusterd-cluster-name") == name}

    assert behaviours() == {"stop"}
    assert bed.daemon.ctl("autostop", duo, "-i", "600", "--down").returncode == 0
    assert behaviours() == {"terminate"}
    assert bed.daemon.ctl("autostop", duo, "--cancel").returncode == 0
    assert behaviours() == {"stop"}


def test_exec_runs_on_both_nodes(bed: Bed, duo: str) -> None:
    result = bed.daemon.ctl("exec", duo, "--num-nodes", "2", "--",
                            "echo $SKYPILOT_NODE_RANK $(hostname -I | wc -w)")
    assert result.returncode == 0, result.stderr
    assert sorted(line.split(")")[1].split()[0] for line in result.stdout.splitlines()) == [
        "0", "1"]


def test_jobs_see_where_they_run_in_skypilot_cluster_info(bed: Bed, duo: str) -> None:
    """Task files written for SkyPilot read `.cloud`, `.region` and `.zone` from it."""
    result = bed.daemon.ctl(
        "exec", duo, "--", "python3 -c 'import json, os; i = json.loads(os.environ"
        "[\"SKYPILOT_CLUSTER_INFO\"]); print(i[\"cluster_name\"], i[\"cloud\"], "
        "i[\"region\"], i[\"zone\"])'")
    assert result.returncode == 0, result.stderr
    status = bed.daemon.cluster(duo)
    assert status is not None
    assert result.stdout.split() == [duo, "AWS", "us-east-1", status["zone"]]
    assert status["zone"].startswith("us-east-1")


# Rank 1 sends to rank 0 over TCP on a port that no rule opens from outside the cluster: only
# the group's rule for its own members lets it through.
EXCHANGE = """
num_nodes: 2
run: |
  python3 - <<'PY'
  import os, socket, sys, time
  rank = int(os.environ["SKYPILOT_NODE_RANK"])
  head = os.environ["SKYPILOT_NODE_IPS"].split()[0]
  if rank == 0:
      server = socket.create_server((head, 23456))
      server.settimeout(60)
      conn, peer = server.accept()
      data = conn.recv(100)
      conn.sendall(data[::-1])
      print(f"rank 0 got {data.decode()} from {peer[0]}")
  else:
      deadline = time.time() + 30
      while True:
          try:
              conn = socket.create_connection((head, 23456), timeout=5)
              break
          except ConnectionRefusedError:  # rank 0 is not listening yet
              if time.time() > deadline:
                  raise
              time.sleep(0.2)
          except OSError as exc:
              print(f"rank {rank} cannot reach {head}:23456: {exc}")
              sys.exit(3)
      conn.sendall(b"hello from " + conn.getsockname()[0].encode())
      print(f"rank {rank} got back {conn.recv(100).decode()}")
  PY
"""


def test_ranks_exchange_tcp_on_a_port_the_task_did_not_open(bed: Bed, duo: str) -> None:
    (bed.daemon.root / "exchange.yaml").write_text(EXCHANGE)
    result = bed.daemon.ctl("exec", duo, "exchange.yaml", timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    worker = next(i for i in bed.instances(cloud_name(bed, duo))
                  if i["tags"]["clusterd-node-role"] == "worker")
    # The connection carried the worker's own address: the group's rule matched it as a member.
    assert f"rank 0 got hello from {worker['ip']} from {worker['ip']}" in result.stdout
    assert f"rank 1 got back {worker['ip'][::-1]} morf olleh" in result.stdout


def test_a_port_not_in_the_group_is_refused_from_the_daemons_side(bed: Bed, duo: str) -> None:
    """The daemon is not a member of the cluster's group: it reaches SSH and the task's ports,
    and nothing else (here, Ray's GCS on the head), while a member (the worker) does."""
    name = cloud_name(bed, duo)
    head = next(i for i in bed.instances(name) if i["tags"]["clusterd-node-role"] == "head")
    # On both nodes, since a 1-node exec may run on either; the head's lines are kept.
    listening = bed.daemon.ctl("exec", duo, "--num-nodes", "2", "--", "ss -Hltnp")
    assert listening.returncode == 0, listening.stderr
    # The GCS's or the raylet's port on the head's address (or on every address): they listen
    # as long as the cluster runs, where a Ray worker's port may close before the probe.
    ports = sorted({int(port) for line in listening.stdout.splitlines()
                    if line.startswith("(head") and ("gcs_server" in line or "raylet" in line)
                    for address, port in [line.split(") ", 1)[1].split()[3].rsplit(":", 1)]
                    if address in (head["ip"], "0.0.0.0", "*", "[::]")})
    ray_port = next((p for p in ports if p not in (22, 8080)), None)
    assert ray_port is not None, listening.stdout
    probe = ("import socket, sys\n"
             "try:\n"
             "    socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)\n"
             "    print('connected')\n"
             "except ConnectionRefusedError:\n"
             "    print('refused')\n"
             "except OSError as exc:\n"
             "    print(type(exc).__name__)\n")

    def from_the_daemon(port: int) -> str:
        done = subprocess.run(["ip", "netns", "exec", bed.netns, sys.executable, "-c", probe,
                               head["ip"], str(port)], capture_output=True, text=True,
                              timeout=30)
        return done.stdout.strip()

    assert from_the_daemon(22) == "connected"
    assert from_the_daemon(8080) == "refused"  # the group lets it in; nothing listens there
    assert from_the_daemon(ray_port) == "TimeoutError"  # dropped, as EC2 drops it
    member = bed.daemon.ctl("exec", duo, "--num-nodes", "2", "--",
                            f"[ $SKYPILOT_NODE_RANK = 1 ] && python3 -c {shlex.quote(probe)} "
                            f"{head['ip']} {ray_port} || true")
    assert member.returncode == 0, member.stderr
    assert "connected" in member.stdout, member.stdout


def test_without_the_self_rule_the_same_job_fails_with_a_clear_reason(
        bed: Bed, duo: str) -> None:
    """The rule is revoked while both ranks run, then rank 1 is let go (a file the bed puts in
    its node's home): Ray's own connections are established by then and live on, as EC2 keeps
    established flows, so only the task's new one is dropped. (Revoked before the job, Ray
    itself cannot start a rank's new worker process on the node: the job hangs in Ray, which
    says nothing of the rule.)"""
    name = cloud_name(bed, duo)
    group = next(g for g in bed.aws()["groups"]
                 if g["tags"].get("clusterd-cluster-name") == name)
    worker = next(i for i in bed.instances(name) if i["tags"]["clusterd-node-role"] == "worker")
    gate = f"self-rule-gate-{uuid.uuid4().hex[:8]}"
    gated = EXCHANGE.replace(
        "  else:\n      deadline",
        "  else:\n      print('rank 1 waits at the gate', flush=True)\n"
        f"      while not os.path.exists(os.path.expanduser('~/{gate}')):\n"
        "          time.sleep(0.2)\n      deadline").replace(
        "server.settimeout(60)", "server.settimeout(600)")
    assert gated != EXCHANGE
    (bed.daemon.root / "gated.yaml").write_text(gated)
    submitted = bed.daemon.ctl("exec", "-d", duo, "gated.yaml")
    assert submitted.returncode == 0, submitted.stderr
    job_id = max(j["job_id"] for j in json.loads(bed.daemon.ctl("queue", duo, "--json").stdout))

    def log() -> str:
        return bed.daemon.ctl("logs", duo, str(job_id), "--no-follow").stdout

    wait_for(lambda: "rank 1 waits at the gate" in log(), 240, "rank 1 to wait at the gate")
    rule = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["id"]}]}]
    bed.ec2.ec2_call("us-east-1", "revoke_security_group_ingress", GroupId=group["id"],
                     IpPermissions=rule)
    try:
        bed.ec2.touch_on_node(worker["id"], f"/home/ubuntu/{gate}")
        result = bed.daemon.ctl("logs", duo, str(job_id), timeout=240)
        assert "rank 1 cannot reach" in result.stdout and "timed out" in result.stdout, (
            result.stdout)
        job = next(j for j in json.loads(bed.daemon.ctl("queue", duo, "--json").stdout)
                   if j["job_id"] == job_id)
        assert job["status"] == "FAILED", job
        assert job["failure_reason"].startswith("rank 1 ("), job
    finally:
        bed.ec2.ec2_call("us-east-1", "authorize_security_group_ingress",
                         GroupId=group["id"], IpPermissions=rule)
    again = bed.daemon.ctl("exec", duo, "exchange.yaml", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr


def test_stop_kills_every_process_of_the_nodes_and_start_brings_them_back(
        bed: Bed, duo: str) -> None:
    name = cloud_name(bed, duo)
    before = {i["id"]: i["ip"] for i in bed.instances(name)}
    # Every process of the two nodes (other beds' nodes on this machine run as ubuntu too).
    running = [p for n in bed.nodes() if n["tags"].get("clusterd-cluster-name") == name
               for p in descendants(n["node_pid"])]
    assert len(running) > 4, running  # sshd, Ray, the agent...
    stopped = bed.daemon.ctl("stop", "-y", duo)
    assert stopped.returncode == 0, stopped.stderr
    assert {i["state"] for i in bed.instances(name)} == {"stopped"}
    ours = [n for n in bed.nodes() if n["tags"].get("clusterd-cluster-name") == name]
    assert [n["node"] for n in ours] == ["none", "none"]
    # Killed with their node's PID namespace; the kernel may take a moment to finish them.
    wait_for(lambda: not [p for p in running if alive(p)], 10,
             "every process of the nodes to die")
    assert bed.daemon.cluster(duo)["status"] == "STOPPED"  # type: ignore[index]

    started = bed.daemon.ctl("start", duo, timeout=600)
    assert started.returncode == 0, started.stderr + bed.daemon.log()[-3000:]
    ips = {i["ip"] for i in bed.instances(name)}
    # As EC2 may, the bed gave each instance a fresh address on its start: clusterd followed.
    assert all(before[i["id"]] != i["ip"] for i in bed.instances(name)), (before, ips)
    result = bed.daemon.ctl("exec", duo, "--num-nodes", "2", "--",
                            "echo $SKYPILOT_NODE_IPS | tr '\\n' ' '; cat data.txt")
    assert result.returncode == 0, result.stderr
    # The job ran on the instances where they are now, with the workdir synced again.
    assert all(set(line.split(")", 1)[1].split()[:2]) == ips
               for line in result.stdout.splitlines() if "127." in line)


def test_a_partitioned_worker_fails_its_job_naming_the_rank_and_makes_the_cluster_init(
        bed: Bed, duo: str) -> None:
    """Node loss without process death: the worker's link is cut, everything on it runs on.
    Its Ray outlives the cut, counted dead by the head: `launch -c` starts it anew, and says
    at once why it cannot join while the group keeps the nodes apart."""
    name = cloud_name(bed, duo)
    worker = next(i for i in bed.instances(name) if i["tags"]["clusterd-node-role"] == "worker")
    group = next(g for g in bed.aws()["groups"] if g["tags"].get("clusterd-cluster-name") == name)
    members = [{"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group["id"]}]}]
    submitted = bed.daemon.ctl("exec", "-d", duo, "--num-nodes", "2", "--",
                               "echo started; sleep 600")
    assert submitted.returncode == 0, submitted.stderr

    def job() -> dict[str, Any]:
        jobs = json.loads(bed.daemon.ctl("queue", duo, "--json").stdout)
        found: dict[str, Any] = max(jobs, key=lambda j: j["job_id"])
        return found

    wait_for(lambda: job()["status"] == "RUNNING", 120, "the job to run")
    cut = bed.testbed("partition", worker["id"])
    assert cut.returncode == 0, cut.stderr
    try:
        wait_for(lambda: job()["status"] not in ("RUNNING", "PENDING"), 180,
                 "the job to notice its lost rank")
        failed = job()
        assert failed["status"] == "FAILED", failed
        assert failed["failure_reason"].startswith(f"rank 1 ({worker['ip']})"), failed
        refreshed = json.loads(bed.daemon.ctl("status", "--refresh", "--json").stdout)
        cluster = next(c for c in refreshed if c["name"] == duo)
        assert cluster["status"] == "INIT", cluster
        assert worker["ip"] in cluster["status_reason"], cluster
        row = next(n for n in bed.nodes() if n["id"] == worker["id"])
        assert row["partitioned"] and row["state"] == "running"
        # Before the link comes back, the group stops letting the nodes reach each other:
        # the worker's Ray stays out of the cluster, alive on its node.
        bed.ec2.ec2_call("us-east-1", "revoke_security_group_ingress", GroupId=group["id"],
                         IpPermissions=members)
    finally:
        healed = bed.testbed("heal", worker["id"])
        assert healed.returncode == 0, healed.stderr
    try:
        refused = bed.daemon.ctl("launch", "-c", duo, timeout=900)
        assert refused.returncode != 0, refused.stderr
        assert "cannot reach the Ray head at" in refused.stderr, refused.stderr
        assert "security group must let its own members in" in refused.stderr
    finally:
        bed.ec2.ec2_call("us-east-1", "authorize_security_group_ingress",
                         GroupId=group["id"], IpPermissions=members)
    relaunched = bed.daemon.ctl("launch", "-c", duo, timeout=900)
    assert relaunched.returncode == 0, relaunched.stderr + bed.daemon.log()[-3000:]
    assert bed.daemon.cluster(duo)["status"] == "UP"  # type: ignore[index]
    again = bed.daemon.ctl("exec", duo, "exchange.yaml", timeout=300)
    assert again.returncode == 0, again.stdout + again.stderr


def test_a_node_lost_behind_our_back_makes_the_cluster_init_with_why(
        bed: Bed, duo: str) -> None:
    name = cloud_name(bed, duo)
    jobs_before = len(json.loads(bed.daemon.ctl("queue", duo, "--json").stdout))
    worker = next(i for i in bed.instances(name) if i["tags"]["clusterd-node-role"] == "worker")
    terminate = ("import boto3; boto3.client('ec2', region_name='us-east-1')"
                 f".terminate_instances(InstanceIds=['{worker['id']}'])")
    done = subprocess.run(["ip", "netns", "exec", bed.netns, sys.executable, "-c", terminate],
                          env=bed.env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    refreshed = json.loads(bed.daemon.ctl("status", "--refresh", "--json").stdout)
    cluster = next(c for c in refreshed if c["name"] == duo)
    assert cluster["status"] == "INIT"
    assert "1 of 2 nodes running, 1 gone" in cluster["status_reason"]
    assert "User initiated" in cluster["status_reason"]

    # A repair that finds no capacity fails, and leaves the surviving head alone (it holds
    # the user's data): only what the repair made would be removed.
    head = next(i for i in bed.instances(name) if i["tags"]["clusterd-node-role"] == "head")
    bed.ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances",
                  "--count", "1")
    try:
        failed = bed.daemon.ctl("launch", "-c", duo, timeout=900)
    finally:
        bed.ec2.clear_faults()
    assert failed.returncode != 0 and "InsufficientInstanceCapacity" in failed.stderr
    assert next(i["state"] for i in bed.instances(name) if i["id"] == head["id"]) == "running"

    # `launch -c NAME` (the hint's command) makes the lost node again where the cluster
    # lives; the head keeps its Ray and agent, so the job queue is still there.
    relaunch = bed.daemon.ctl("launch", "-c", duo, timeout=900)
    assert relaunch.returncode == 0, relaunch.stderr + bed.daemon.log()[-3000:]
    assert f"{duo} lost nodes; making them again in aws/us-east-1/" in relaunch.stderr
    assert "stopping" not in relaunch.stderr  # nothing of the head was restarted
    running = [i for i in bed.instances(name) if i["state"] == "running"]
    assert len(running) == 2 and len({i["zone"] for i in running}) == 1
    assert len(json.loads(bed.daemon.ctl("queue", duo, "--json").stdout)) == jobs_before
    ranks = bed.daemon.ctl("exec", duo, "--num-nodes", "2", "--", "echo $SKYPILOT_NODE_RANK")
    assert ranks.returncode == 0, ranks.stderr
    assert sorted(line.split()[-1] for line in ranks.stdout.splitlines()) == ["0", "1"]


# Another clusterd sharing the AWS account, with a cluster of the same name on the cloud.
FOREIGN_INSTANCE = """
import boto3
ec2 = boto3.client("ec2", region_name="us-east-1")
image = ec2.describe_images(Owners=["099720109477"])["Images"][0]["ImageId"]
subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
tags = [{"Key": "clusterd-cluster-name", "Value": CLOUD_NAME},
        {"Key": "clusterd-managed-by", "Value": "clusterd-someone-else"},
        {"Key": "clusterd-node-role", "Value": "head"}]
print(ec2.run_instances(ImageId=image, InstanceType="t3.micro", MinCount=1, MaxCount=1,
                        SubnetId=subnet, TagSpecifications=[
                            {"ResourceType": "instance", "Tags": tags}]
                        )["Instances"][0]["InstanceId"])
"""


def test_down_leaves_no_instance_and_no_security_group(bed: Bed, duo: str) -> None:
    name = cloud_name(bed, duo)
    theirs = bed.ec2.python(FOREIGN_INSTANCE.replace("CLOUD_NAME", repr(name))).strip()
    try:
        result = bed.daemon.ctl("down", "-y", duo, timeout=600)
        assert result.returncode == 0, result.stderr
        state = bed.aws()
        assert {i["state"] for i in state["instances"] if i["id"] != theirs
                and i["tags"].get("clusterd-cluster-name") == name} == {"terminated"}
        assert [g for g in state["groups"] if g["tags"].get("clusterd-cluster-name") == name
                or g["name"] == f"clusterd-{name}"] == []
        # Another clusterd's instance of the same name: left alone, the user told so in the
        # command's output, and an event kept.
        assert next(i["state"] for i in state["instances"] if i["id"] == theirs) == "running"
        told = [line for line in result.stderr.splitlines() if theirs in line]
        assert len(told) == 1 and "warning:" in told[0], result.stderr
        assert "belongs to another clusterd (clusterd-managed-by: clusterd-someone-else" in (
            told[0])
        events = json.loads(bed.daemon.ctl("events", duo, "--json").stdout)
        assert [e["kind"] for e in events if theirs in e["reason"]] == ["foreign"]
    finally:
        bed.ec2.python("import boto3; boto3.client('ec2', region_name='us-east-1')"
                       f".terminate_instances(InstanceIds=['{theirs}'])")


def test_a_spot_preemption_is_noticed_with_its_reason(bed: Bed) -> None:
    (bed.daemon.root / "spot.yaml").write_text(
        "resources:\n  cpus: 2\n  use_spot: true\nrun: echo on spot\n")
    launched = bed.daemon.ctl("launch", "-c", "sp", "--infra", "aws/us-east-1", "spot.yaml",
                              timeout=900)
    assert launched.returncode == 0, launched.stderr + bed.daemon.log()[-3000:]
    assert "on spot" in launched.stdout
    name = cloud_name(bed, "sp")
    (instance,) = bed.instances(name)
    preempted = bed.testbed("preempt", instance["id"])
    assert preempted.returncode == 0, preempted.stderr
    refreshed = bed.daemon.ctl("status", "--refresh")
    assert refreshed.returncode == 0 and "sp " not in refreshed.stdout
    events = json.loads(bed.daemon.ctl("events", "sp", "--json").stdout)
    assert "Server.SpotInstanceTermination" in events[-1]["reason"]
    assert events[-1]["to_status"] == "TERMINATED"
    assert [g for g in bed.aws()["groups"] if g["name"] == f"clusterd-{name}"] == []


def test_agent_autostop_without_a_daemon_stops_the_instance(bed: Bed) -> None:
    launched = bed.daemon.ctl("launch", "-c", "solo", "--infra", "aws/us-east-1", "--cpus",
                              "2", "--", "echo solo", timeout=900)
    assert launched.returncode == 0, launched.stderr + bed.daemon.log()[-3000:]
    name = cloud_name(bed, "solo")
    assert bed.daemon.ctl("autostop", "solo", "-i", "0.05", "--wait-for", "jobs").returncode == 0
    bed.daemon.stop()  # no daemon: the agent is on its own (grace 5 s)
    try:
        wait_for(lambda: {i["state"] for i in bed.instances(name)} == {"stopped"}, 120,
                 "the agent to shut its node down")
        (instance,) = bed.instances(name)
        assert instance["reason"] == "Client.InstanceInitiatedShutdown"
    finally:
        bed.daemon.start()
    status = bed.daemon.ctl("status", "--refresh", "--json")
    solo = next(c for c in json.loads(status.stdout) if c["name"] == "solo")
    assert solo["status"] == "STOPPED"
    assert "Client.InstanceInitiatedShutdown" in solo["status_reason"]
