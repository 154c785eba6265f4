"""AWS benchmarks on the EC2 test bed (need root): launch wall time by phase beside a local
launch in the same run, and the API calls one refresh of many AWS clusters costs.

Run through `scripts/bench --only aws_launch,aws_refresh`. The bed gets a namespace and a
directory of its own, and a second daemon inside it; both go away at the end.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from typing import Any

from bench_bed import PROGRESS, BedDaemon, insert_records, launch_beside_local, timed


class AWSBed(BedDaemon):
    """The EC2 test bed, and a daemon of its own inside the bed's namespace."""

    kind = "ec2"

    def up_args(self) -> list[str]:
        # The runtime image: an AMI with the runtime installed, as README's "baking an AMI"
        # makes one (its own row below).
        return ["--regions", "us-east-1,us-west-2", "--runtime-image"]

    def daemon_env(self, bed_env: dict[str, str]) -> dict[str, str]:
        return {**{k: v for k, v in bed_env.items() if k.startswith("AWS_")},
                "CLUSTERD_CONFIG": bed_env["CLUSTERD_CONFIG"]}

    def calls(self, reset: bool = False) -> list[dict[str, Any]]:
        args = ["calls", "--json"] + (["--reset"] if reset else [])
        calls: list[dict[str, Any]] = json.loads(self._testbed(*args).stdout)["calls"]
        return calls


# Three launches each, for a median: two fresh launches on the bed differed by up to 30%.
def bench_aws_launch(bench: Any, runs: int = 3) -> None:
    print("(j) launch of a 2-node AWS cluster on the EC2 test bed vs a local launch",
          file=sys.stderr)
    bed = AWSBed(bench)
    try:
        bed.up()
        launch_beside_local(bench, bed, "aws_launch_2_nodes", "aws/us-east-1", runs, "2")
        # The same on an image with the runtime already installed: no copy, no install.
        images = json.loads(bed.bed_env["CLUSTERD_TESTBED_RUNTIME_IMAGES"])
        task = bed.root / "on-image.yaml"
        task.write_text("resources:\n  image_id:\n" + "".join(
            f"    {region}: {ami}\n" for region, ami in images.items()) + "run: 'true'\n")
        launch_beside_local(bench, bed, "aws_launch_2_nodes_runtime_image", "aws/us-east-1",
                            runs, "2", task=task, then_start=False)
    finally:
        bed.down()


# Inside the bed: how long until a rule change through the API holds for new connections.
# Nothing listens on the port: a connect refused (a reset) means the group let it through, one
# that times out means it was dropped.
RULE_CHANGE = """
import boto3, json, socket, statistics, time
ec2 = boto3.client("ec2", region_name="us-east-1")
group, ip, port = __GROUP__, __IP__, 7999
permission = [{"IpProtocol": "tcp", "FromPort": port, "ToPort": port,
               "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]

def let_through():
    try:
        socket.create_connection((ip, port), timeout=0.05).close()
        return True
    except ConnectionRefusedError:
        return True
    except OSError:
        return False

def until(wanted):
    started = time.monotonic()
    while let_through() != wanted:
        if time.monotonic() - started > 30:
            raise SystemExit("the bed did not apply a rule change within 30 s")
    return time.monotonic() - started

opened, closed = [], []
for _ in range(__ROUNDS__):
    ec2.authorize_security_group_ingress(GroupId=group, IpPermissions=permission)
    opened.append(until(True))
    ec2.revoke_security_group_ingress(GroupId=group, IpPermissions=permission)
    closed.append(until(False))
print(json.dumps({"opened": opened, "closed": closed}))
"""


def bench_aws_security_groups(bench: Any, runs: int = 2, rounds: int = 5) -> None:
    print("(o) the EC2 bed's security groups: a rule change applied; a 2-node launch with "
          "them enforced vs not", file=sys.stderr)
    bed = AWSBed(bench)
    try:
        bed.up()
        enforced: list[float] = []
        open_ports: list[float] = []
        kept = ""
        for index in range(runs):
            for enforce, walls in ((False, open_ports), (True, enforced)):
                bed._testbed("firewall", "--on" if enforce else "--off")
                name = f"sg{index}{'on' if enforce else 'off'}"
                wall, done = timed(lambda n=name: bed.ctl(
                    "launch", "-c", n, "--infra", "aws/us-east-1", "--num-nodes", "2",
                    "--cpus", "2", "--", "true"))
                if done.returncode != 0:
                    raise SystemExit(f"aws launch failed: {done.stderr}")
                walls.append(wall)
                if enforce and index == runs - 1:
                    kept = name
                else:
                    bed.ctl("down", "-y", name)
        bench.record("aws_launch_2_nodes_groups_enforced", statistics.median(enforced), "s",
                     baseline=statistics.median(open_ports),
                     baseline_name="the same launch, groups not enforced")
        cloud_name = next(c["cloud_name"] for c in json.loads(bed.ctl("status", "--json").stdout)
                          if c["name"] == kept)
        where = json.loads(bed.python(
            "import boto3, json\n"
            "r = boto3.client('ec2', region_name='us-east-1').describe_instances(Filters=["
            f"{{'Name': 'tag:clusterd-cluster-name', 'Values': [{cloud_name!r}]}}, "
            "{'Name': 'tag:clusterd-node-role', 'Values': ['head']}])\n"
            "i = r['Reservations'][0]['Instances'][0]\n"
            "g = i['SecurityGroups'] or i['NetworkInterfaces'][0]['Groups']\n"
            "print(json.dumps([i['PrivateIpAddress'], g[0]['GroupId']]))"))
        changes = json.loads(bed.python(
            RULE_CHANGE.replace("__GROUP__", repr(where[1]))
            .replace("__IP__", repr(where[0])).replace("__ROUNDS__", str(rounds))))
        opened, closed = changes["opened"], changes["closed"]
        bench.record("bed_rule_change_applied_s", statistics.median(opened), "s",
                     target="≤ 2 s", ok=max(opened + closed) <= 2.0,
                     max_s=round(max(opened + closed), 2),
                     closed_p50_s=round(statistics.median(closed), 2), rounds=rounds)
    finally:
        bed.down()


FAKE_CLUSTERS = """
import boto3, json
ec2 = boto3.client("ec2", region_name="us-east-1")
subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
image = ec2.describe_images(Owners=["099720109477"])["Images"][0]["ImageId"]
made = []
for i in range(COUNT):
    name = f"refresh-{i:03d}-x"
    tags = [{"Key": "clusterd-cluster-name", "Value": name},
            {"Key": "clusterd-managed-by", "Value": "MANAGED_BY"},
            {"Key": "clusterd-node-role", "Value": "head"}]
    run = ec2.run_instances(ImageId=image, InstanceType="c6i.large", MinCount=1, MaxCount=1,
                            SubnetId=subnet, TagSpecifications=[
                                {"ResourceType": "instance", "Tags": tags}])
    made.append((name, run["Instances"][0]["InstanceId"]))
ec2.stop_instances(InstanceIds=[i for _, i in made])
print(json.dumps(made))
"""


def bench_aws_refresh(bench: Any, clusters: int = 100) -> None:
    print(f"(k) one refresh of {clusters} AWS clusters in one region: API calls",
          file=sys.stderr)
    bed = AWSBed(bench)
    try:
        bed.up()
        managed_by = (bed.state_dir / "daemon-id").read_text().strip()
        made = json.loads(bed.python(FAKE_CLUSTERS.replace("COUNT", str(clusters))
                                     .replace("MANAGED_BY", managed_by)))
        # Records as launches would have left them (the instances exist, stopped): straight
        # into the database while the daemon is down.
        bed.stop_daemon()
        insert_records(bed.state_dir / "state.db", "aws", "UP", [
            (cloud_name, {"infra": "aws/us-east-1"},
             {"provider": "aws", "region": "us-east-1", "cpus": 2},
             {"provider": {"region": "us-east-1", "ssh_user": "ubuntu",
                           "nodes": [{"id": instance, "role": "head"}]}})
            for cloud_name, instance in made])
        bed.start_daemon()
        bed.ctl("status", "--refresh")  # settles the inserted records once
        bed.calls(reset=True)
        wall, done = timed(lambda: bed.ctl("status", "--refresh", "--json"))
        listed = [c for c in json.loads(done.stdout) if c["status"] == "STOPPED"]
        calls = bed.calls()
        describes = sum(c["count"] for c in calls if c["action"] == "DescribeInstances")
        total = sum(c["count"] for c in calls)
        bench.record("aws_refresh_100_describe_calls", describes, "calls",
                     target="= 1 per region", ok=describes == 1 and len(listed) == clusters,
                     all_calls=total, clusters_stopped=len(listed),
                     refresh_s=round(wall, 2))
    finally:
        bed.down()


def bench_failover(bench: Any) -> None:
    print("(l) failover: landing after stockouts in 5 zones; decision overhead per attempt",
          file=sys.stderr)
    from clusterctl import Client, PingArgs

    bed = AWSBed(bench)
    try:
        bed.up()
        socket_path = str(bed.root / "rt" / "clusterd" / "clusterd.sock")
        for zone in "abcdf":  # every zone of us-east-1 offering c6i.large
            done = bed._testbed("fault", "add", "--code", "InsufficientInstanceCapacity",
                                "--zone", f"us-east-1{zone}")
            if done.returncode != 0:
                raise SystemExit(f"fault add failed: {done.stderr}")
        with Client(socket_path, autostart=False) as client:
            before = client.call(PingArgs())["provision"]
        started = time.monotonic()
        done = bed.ctl("launch", "-c", "fo", "--infra", "aws", "--cpus", "2", "--", "true")
        if done.returncode != 0:
            raise SystemExit(f"launch failed: {done.stderr}")
        landed = next((float(m.group(1)) for line in done.stderr.splitlines()
                       if (m := PROGRESS.match(line.strip())) and "preparing the runtime"
                       in m.group(2)), time.monotonic() - started)
        with Client(socket_path, autostart=False) as client:
            after = client.call(PingArgs())["provision"]
        attempts = after["attempts"] - before["attempts"]
        provider = after["provider_seconds"] - before["provider_seconds"]
        bench.record("failover_land_after_5_stockouts", landed, "s", baseline=provider,
                     baseline_name="sum of the provider calls", attempts=attempts)
        bench.record("failover_decision_ms_p50", after["decision_ms_p50"], "ms",
                     target="≤ 20 ms per attempt", ok=after["decision_ms_max"] <= 20,
                     max_ms=after["decision_ms_max"])
    finally:
        bed.down()
