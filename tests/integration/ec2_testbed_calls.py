"""The EC2 test bed's own tests' calls: the bed driven through its command line, boto3 run
inside its namespace (PRELUDE), OpenSSH to its nodes, and scripts run on a node."""

from __future__ import annotations

import base64
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from tests.support import wait_for

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "scripts" / "testbed"
CANONICAL = "099720109477"
ACCOUNT = "123456789012"
RUNTIME_IMAGE_PREFIX = "clusterd-testbed-runtime-"
JAMMY_AMD64 = "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"
SSH_OPTS = ["-F", "/dev/null", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=no",
            "-o", "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
            "-o", "ConnectTimeout=10"]
# Run in the namespace before each snippet: boto3 clients as a program would make them.
PRELUDE = """
import json, sys, time
import boto3, botocore
from botocore.config import Config
from botocore.exceptions import ClientError

def ec2(region="us-east-1", **config):
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": 1})
    return boto3.client("ec2", region_name=region, config=Config(**config))

def subnet(zone, region="us-east-1"):
    return ec2(region).describe_subnets(
        Filters=[{"Name": "availability-zone", "Values": [zone]}])["Subnets"][0]["SubnetId"]

def image(region="us-east-1"):
    return ec2(region).describe_images(Owners=["099720109477"], Filters=[
        {"Name": "name", "Values": ["ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*"]}
    ])["Images"][0]["ImageId"]

def group(name, region="us-east-1", ports=(22,)):
    # A security group of the bed's VPC letting in ports from anywhere (made once).
    c = ec2(region)
    found = c.describe_security_groups(
        Filters=[{"Name": "group-name", "Values": [name]}])["SecurityGroups"]
    if found:
        return found[0]["GroupId"]
    vpc = c.describe_vpcs()["Vpcs"][0]["VpcId"]
    gid = c.create_security_group(GroupName=name, Description=name, VpcId=vpc)["GroupId"]
    if ports:
        c.authorize_security_group_ingress(GroupId=gid, IpPermissions=[
            {"IpProtocol": "tcp", "FromPort": p, "ToPort": p,
             "IpRanges": [{"CidrIp": "0.0.0.0/0"}]} for p in ports])
    return gid

def launch(zone="us-east-1a", count=1, client=None, **kw):
    # Security groups are enforced: the tests reach nodes by SSH from the bed's namespace.
    kw.setdefault("SecurityGroupIds", [group("ssh-from-anywhere", zone[:-1])])
    r = (client or ec2()).run_instances(
        ImageId=kw.pop("ImageId", None) or image(), MinCount=count, MaxCount=count,
        KeyName="testkey", InstanceType=kw.pop("InstanceType", "t3.micro"),
        SubnetId=subnet(zone), **kw)
    return [i["InstanceId"] for i in r["Instances"]]

def out(value):
    print(json.dumps(value))
"""


@dataclasses.dataclass
class Bed:
    dir: Path
    netns: str
    key: Path

    def testbed(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        n = 2 if args[0] == "fault" else 1  # `--dir` goes after the (sub)command
        cmd = [sys.executable, str(TESTBED), "ec2", *args[:n], "--dir", str(self.dir),
               *args[n:]]
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)

    def ok(self, *args: str, timeout: float = 120) -> str:
        p = self.testbed(*args, timeout=timeout)
        assert p.returncode == 0, f"testbed ec2 {' '.join(args)}: {p.stderr}{p.stdout}"
        return p.stdout

    def py(self, code: str, timeout: float = 60) -> Any:
        """Run PRELUDE + code with python inside the namespace; the JSON it printed last."""
        stdout = self.ok("exec", "--", "python", "-c", PRELUDE + code, timeout=timeout)
        return json.loads(stdout.strip().splitlines()[-1])

    def ssh(self, ip: str, command: str) -> subprocess.CompletedProcess[str]:
        return self.testbed("exec", "--", "ssh", *SSH_OPTS, "-i", str(self.key),
                            f"ubuntu@{ip}", command, timeout=60)

    def status(self) -> dict[str, list[dict[str, Any]]]:
        regions: dict[str, list[dict[str, Any]]] = json.loads(self.ok("status", "--json"))[
            "regions"]
        return regions

    def instance(self, instance_id: str) -> dict[str, Any]:
        for rows in self.status().values():
            for row in rows:
                if row["id"] == instance_id:
                    return row
        raise AssertionError(f"{instance_id} is not in `ec2 status`")

    def wait_node(self, instance_id: str, node: str, state: str | None = None,
                  timeout: float = 30) -> dict[str, Any]:
        def reached() -> dict[str, Any] | None:
            row = self.instance(instance_id)
            good = row["node"] == node and (state is None or row["state"] == state)
            return row if good else None

        row: dict[str, Any] = wait_for(reached, timeout, f"{instance_id}: node {node}",
                                       interval=0.2)
        return row


# On a node: echo each line back with the peer's address (so a test sees who connected).
ECHO_SERVER = """
import socket, sys, threading
server = socket.create_server((sys.argv[1], int(sys.argv[2])))
def serve(conn, peer):
    for line in conn.makefile("rb"):
        conn.sendall(line.strip() + b" from " + peer[0].encode() + b"\\n")
while True:
    conn, peer = server.accept()
    threading.Thread(target=serve, args=(conn, peer), daemon=True).start()
"""
# Anywhere: one line through a fresh connection, or why there was none.
PROBE = """
import socket, sys
try:
    conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3)
    conn.sendall(b"hi\\n")
    print(conn.makefile("rb").readline().decode().strip())
except ConnectionRefusedError:
    print("refused")
except OSError as exc:
    print(type(exc).__name__)
"""


def on_node(bed: Bed, ip: str, script: str, *args: str, background: bool = False) -> str:
    """Run a python script on the node at ip (as ubuntu), in the background or for its
    output."""
    encoded = base64.b64encode(script.encode()).decode()
    name = f"/tmp/script-{abs(hash(script))}.py"
    run = f"python3 {name} {' '.join(args)}"
    if background:  # nothing of ssh's channel kept open: ssh returns at once
        run = f"{{ nohup setsid {run} </dev/null >/dev/null 2>&1 & }}"
    r = bed.ssh(ip, f"echo {encoded} | base64 -d > {name} && {run}")
    assert r.returncode == 0, r.stderr
    return r.stdout.strip()


def from_bed(bed: Bed, ip: str, port: int) -> str:
    """PROBE from the bed's own namespace (where clusterd's daemon runs)."""
    return bed.ok("exec", "--", "python", "-c", PROBE, ip, str(port)).strip()
