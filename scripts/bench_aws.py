"""AWS benchmarks on the EC2 test bed (need root): launch wall time by phase beside a local
launch in the same run, and the API calls one refresh of many AWS clusters costs.

Run through `scripts/bench --only aws_launch,aws_refresh`. The bed gets a namespace and a
directory of its own, and a second daemon inside it; both go away at the end.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTBED = Path(__file__).resolve().parent / "testbed"
PROGRESS = re.compile(r"^\[\s*([\d.]+)s\] (.*)$")
# Progress lines that open each phase of a launch, in order.
PHASES = (("placement", "checking where"), ("provision", "creating nodes on"),
          ("install", "preparing the runtime"), ("ray", "starting Ray"),
          ("agent", "starting the agent"), ("up", " is UP"))


class AWSBed:
    """The EC2 test bed, and a daemon of its own inside the bed's namespace."""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.dir = Path(tempfile.mkdtemp(prefix="cdbec2-", dir="/tmp"))
        self.netns = f"cdbench-{os.getpid()}"
        self.root = Path(tempfile.mkdtemp(prefix="cdba-", dir="/tmp"))
        self.daemon: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}

    def up(self) -> None:
        done = self._testbed("up", "--netns", self.netns, "--regions", "us-east-1,us-west-2")
        if done.returncode != 0:
            raise SystemExit(f"ec2 test bed failed: {done.stderr}")
        bed_env = json.loads(self._testbed("env", "--json").stdout)
        runtime = self.root / "rt"
        runtime.mkdir(mode=0o700)
        (self.root / "home").mkdir()
        self.env = {**self.bench.env,
                    **{k: v for k, v in bed_env.items() if k.startswith("AWS_")},
                    "CLUSTERD_CONFIG": bed_env["CLUSTERD_CONFIG"],
                    "CLUSTERD_WHEELHOUSE_DIR": bed_env["CLUSTERD_WHEELHOUSE_DIR"],
                    "XDG_RUNTIME_DIR": str(runtime),
                    "XDG_STATE_HOME": str(self.root / "state"),
                    "XDG_CONFIG_HOME": str(self.root / "config"),
                    "HOME": str(self.root / "home")}
        self.start_daemon()

    @property
    def state_dir(self) -> Path:
        return self.root / "state" / "clusterd"

    def start_daemon(self) -> None:
        socket_path = self.root / "rt" / "clusterd" / "clusterd.sock"
        with open(self.root / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, sys.executable, "-m", "clusterd"],
                env=self.env, stdout=log, stderr=log, start_new_session=True, cwd="/")
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                raise SystemExit(f"clusterd in the bed did not start; see {self.root}")
            time.sleep(0.05)

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(30)

    def ctl(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, str(
            Path(sys.executable).with_name("clusterctl")), *args], env=self.env,
            capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def python(self, code: str) -> str:
        done = subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-c", code],
                              env=self.env, capture_output=True, text=True, timeout=300)
        if done.returncode != 0:
            raise SystemExit(f"python in the bed failed: {done.stderr}")
        return done.stdout

    def calls(self, reset: bool = False) -> list[dict[str, Any]]:
        args = ["calls", "--json"] + (["--reset"] if reset else [])
        calls: list[dict[str, Any]] = json.loads(self._testbed(*args).stdout)["calls"]
        return calls

    def down(self) -> None:
        try:
            for cluster in json.loads(self.ctl("status", "--json").stdout or "[]"):
                self.ctl("down", "-y", "--purge", cluster["name"])
        finally:
            self.stop_daemon()
            self._testbed("down")
            shutil.rmtree(self.root, ignore_errors=True)

    def _testbed(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(TESTBED), "ec2", *args, "--dir",
                               str(self.dir)], capture_output=True, text=True, timeout=600)


def phases(stderr: str, wall: float) -> dict[str, float]:
    """Seconds spent in each launch phase, from the progress lines' timestamps."""
    marks: list[tuple[str, float]] = []
    for line in stderr.splitlines():
        found = PROGRESS.match(line.strip())
        if not found:
            continue
        for phase, text in PHASES:
            if text in found.group(2) and phase not in dict(marks):
                marks.append((phase, float(found.group(1))))
    marks.append(("job", wall))
    return {name: round(marks[i + 1][1] - at, 2) for i, (name, at) in enumerate(marks[:-1])}


def _timed(run: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = run()
    return time.monotonic() - started, done


def bench_aws_launch(bench: Any, runs: int = 2) -> None:
    print("(j) launch of a 2-node AWS cluster on the EC2 test bed vs a local launch",
          file=sys.stderr)
    bed = AWSBed(bench)
    try:
        bed.up()
        aws, local, aws_phases, local_phases = [], [], [], []
        for index in range(runs):
            wall, done = _timed(lambda i=index: bed.ctl(
                "launch", "-c", f"bl{i}", "--infra", "aws/us-east-1", "--num-nodes", "2",
                "--cpus", "2", "--", "true"))
            if done.returncode != 0:
                raise SystemExit(f"aws launch failed: {done.stderr}")
            aws.append(wall)
            aws_phases.append(phases(done.stderr, wall))
            bed.ctl("down", "-y", f"bl{index}")
            wall, done = _timed(lambda i=index: bench.ctl("launch", "-c", f"bloc{i}", "--",
                                                          "true"))
            if done.returncode != 0:
                raise SystemExit(f"local launch failed: {done.stderr}")
            local.append(wall)
            local_phases.append(phases(done.stderr, wall))
            bench.ctl("down", "-y", f"bloc{index}")
        median = statistics.median(aws)

        def split(rows: list[dict[str, float]]) -> str:
            keys = list(dict.fromkeys(k for row in rows for k in row))
            return ",".join(f"{k}:{statistics.median(r.get(k, 0.0) for r in rows):.1f}"
                            for k in keys)

        bench.record("aws_launch_2_nodes", median, "s", baseline=statistics.median(local),
                     baseline_name="local launch", phases=split(aws_phases),
                     local_phases=split(local_phases))
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
                wall, done = _timed(lambda n=name: bed.ctl(
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
        _insert_aws_records(bed.state_dir / "state.db", made)
        bed.start_daemon()
        bed.ctl("status", "--refresh")  # settles the inserted records once
        bed.calls(reset=True)
        wall, done = _timed(lambda: bed.ctl("status", "--refresh", "--json"))
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


def _insert_aws_records(db_path: Path, made: list[list[str]]) -> None:
    now = time.time()
    db = sqlite3.connect(db_path)
    try:
        with db:
            db.executemany(
                "INSERT INTO clusters (name, provider, cloud_name, status, status_reason,"
                " num_nodes, requested_resources, launched_resources, handle, config_hash,"
                " created_at, launched_at, status_updated_at, ever_up)"
                " VALUES (?, 'aws', ?, 'UP', 'inserted by the benchmark', 1, ?, ?, ?,"
                " 'bench', ?, ?, ?, 1)",
                [(cloud_name.rsplit("-", 1)[0], cloud_name,
                  json.dumps({"infra": "aws/us-east-1"}),
                  json.dumps({"provider": "aws", "region": "us-east-1", "cpus": 2}),
                  json.dumps({"provider": {"region": "us-east-1", "ssh_user": "ubuntu",
                                           "nodes": [{"id": instance, "role": "head"}]}}),
                  now, now, now) for cloud_name, instance in made],
            )
    finally:
        db.close()
