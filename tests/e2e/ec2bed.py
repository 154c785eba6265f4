"""The EC2 test bed for end-to-end tests: one per test session (its namespace and directory of
its own), and daemons inside it, each with directories (and so a managed-by id) of its own."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.support import Daemon, cloud_name, make_env, running, short_tempdir, wait_for

ROOT = Path(__file__).resolve().parents[2]
TESTBED = str(ROOT / "scripts" / "testbed")
REGIONS = "us-east-1,us-west-2"
AWS_STATE = """
import json, boto3
out = {"instances": [], "groups": []}
for region in REGIONS.split(","):
    ec2 = boto3.client("ec2", region_name=region)
    for r in ec2.describe_instances()["Reservations"]:
        for i in r["Instances"]:
            out["instances"].append({"id": i["InstanceId"], "state": i["State"]["Name"],
                "ip": i.get("PrivateIpAddress"), "region": region,
                "zone": i["Placement"]["AvailabilityZone"],
                "reason": (i.get("StateReason") or {}).get("Code"),
                "tags": {t["Key"]: t["Value"] for t in i.get("Tags", [])}})
    for g in ec2.describe_security_groups()["SecurityGroups"]:
        out["groups"].append({"id": g["GroupId"], "name": g["GroupName"], "region": region,
            "tags": {t["Key"]: t["Value"] for t in g.get("Tags", [])},
            "ports": sorted((p["FromPort"], p["ToPort"]) for p in g.get("IpPermissions", [])
                            if p["IpProtocol"] == "tcp"),
            "members_from": sorted(pair["GroupId"] for p in g.get("IpPermissions", [])
                                   if p["IpProtocol"] == "-1"
                                   for pair in p.get("UserIdGroupPairs", []))})
print(json.dumps(out))
""".replace("REGIONS", repr(REGIONS))


@dataclasses.dataclass
class EC2Bed:
    dir: Path
    netns: str
    env: dict[str, str]  # what `ec2 env` sets (the AWS part of a daemon's environment)

    def testbed(self, *args: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, TESTBED, "ec2", *args, "--dir", str(self.dir)],
                              capture_output=True, text=True, timeout=timeout)

    def python(self, code: str, admin: bool = False) -> str:
        """Run code in the bed with its AWS settings; `admin`: with keys allowed everything
        (a bed up with --iam gives `exec` the keys of README's policy)."""
        env = {**self.env, "AWS_SHARED_CREDENTIALS_FILE": str(self.dir / "aws/admin-credentials")
               } if admin else self.env
        done = subprocess.run(["ip", "netns", "exec", self.netns, sys.executable, "-c", code],
                              env=env, capture_output=True, text=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stdout

    def aws(self) -> dict[str, Any]:
        """What moto holds now, read through the API from inside the namespace."""
        state: dict[str, Any] = json.loads(self.python(AWS_STATE))
        return state

    def instances(self, cloud_name: str) -> list[dict[str, Any]]:
        return [i for i in self.aws()["instances"]
                if i["tags"].get("clusterd-cluster-name") == cloud_name]

    def leftovers(self, cloud_name: str) -> list[str]:
        """Instances not terminated and security groups of a cluster, as moto holds them."""
        state = self.aws()
        return ([i["id"] for i in state["instances"]
                 if i["tags"].get("clusterd-cluster-name") == cloud_name
                 and i["state"] != "terminated"]
                + [g["id"] for g in state["groups"]
                   if g["tags"].get("clusterd-cluster-name") == cloud_name
                   or g["name"] == f"clusterd-{cloud_name}"])

    def instances_now(self) -> list[dict[str, Any]]:
        """Every instance as the bed's controller holds it now (id, state, zone, tags), asked
        over its control socket: no process started, so cheap enough to poll every second."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(30)
            sock.connect(str(self.dir / "control.sock"))
            sock.sendall(b'{"op": "status"}\n')
            with sock.makefile("rb") as f:
                reply = json.loads(f.readline())
        assert reply.get("ok"), reply
        return [i for rows in reply["regions"].values() for i in rows]

    def node_logs(self, tail: int = 3000) -> str:
        """The end of every node's log (its init and sshd's, which says why a login was
        refused), for a failure's message."""
        out = []
        for log_file in sorted((self.dir / "instances").glob("*/node.log")):
            text = log_file.read_text(errors="replace")
            out.append(f"--- {log_file.parent.name}:\n{text[-tail:]}")
        return "\n".join(out)

    def nodes(self) -> list[dict[str, Any]]:
        status = json.loads(self.testbed("status", "--json").stdout)
        return [i for instances in status["regions"].values() for i in instances]

    def touch_on_node(self, instance_id: str, path: str) -> None:
        """Make an empty file on a node's disk from the bed's side, whatever its network lets
        through: as root, in the node's mount namespace (its disk is mounted only there)."""
        (node_pid,) = [n["node_pid"] for n in self.nodes() if n["id"] == instance_id]
        done = subprocess.run(["nsenter", "--target", str(node_pid), "--mount", "--", "touch",
                               path], capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr

    def firewall_syncs(self) -> int:
        """How many passes over the API the bed's firewall has finished."""
        done = self.testbed("firewall", "--json")
        assert done.returncode == 0, done.stderr
        return int(json.loads(done.stdout)["syncs"])

    def ec2_call(self, region: str, action: str, **params: Any) -> None:
        """One EC2 call through the API (as a user of the account would make it), and the
        bed's firewall caught up with it: a whole pass of it began after the call."""
        self.python(f"import boto3; boto3.client('ec2', region_name={region!r})"
                    f".{action}(**{params!r})")
        after = self.firewall_syncs()
        wait_for(lambda: self.firewall_syncs() >= after + 2, 10,
                 f"the bed's firewall to apply {action}")

    def fault(self, *args: str) -> str:
        done = self.testbed("fault", "add", *args)
        assert done.returncode == 0, done.stderr
        return done.stdout.strip()

    def clear_faults(self) -> None:
        assert self.testbed("fault", "clear").returncode == 0

    def runtime_images(self) -> dict[str, str]:
        images: dict[str, str] = json.loads(self.env.get("CLUSTERD_TESTBED_RUNTIME_IMAGES")
                                            or "{}")
        return images

    def daemon(self, prefix: str, **extra: str) -> Daemon:
        """A daemon inside the bed, with directories of its own (not started)."""
        root = short_tempdir(prefix)
        env = make_env(root)
        home = root / "home"
        home.mkdir()
        env.update({k: v for k, v in self.env.items() if k.startswith("AWS_")})
        env.update(CLUSTERD_CONFIG=self.env["CLUSTERD_CONFIG"],
                   CLUSTERD_WHEELHOUSE_DIR=self.env["CLUSTERD_WHEELHOUSE_DIR"],
                   HOME=str(home))
        env.update(extra)
        return Daemon(root, env, wrap=["ip", "netns", "exec", self.netns])


@contextlib.contextmanager
def ec2_bed(iam: bool = False, image_roots: bool = False) -> Iterator[EC2Bed]:
    """A bed of its own; `iam`: enforcing IAM (`up --iam`), `image_roots`: instances boot in
    their images' roots (`up --image-roots`), either without a runtime image."""
    bed_dir = short_tempdir("cdec2-")
    # Not the bed integration tests' name (same process), nor the other e2e beds'.
    suffix = ("-iam" if iam else "") + ("-img" if image_roots else "")
    netns = f"cde2e-{os.getpid()}{suffix}"
    options = [*(["--iam"] if iam else []), *(["--image-roots"] if image_roots else [])]
    up = subprocess.run([sys.executable, TESTBED, "ec2", "up", "--dir", str(bed_dir),
                         "--netns", netns, "--regions", REGIONS,
                         *(options or ["--runtime-image"])],
                        capture_output=True, text=True, timeout=900)
    try:
        assert up.returncode == 0, up.stdout + up.stderr
        env = json.loads(subprocess.run(
            [sys.executable, TESTBED, "ec2", "env", "--dir", str(bed_dir), "--json"],
            capture_output=True, text=True, timeout=60, check=True).stdout)
        yield EC2Bed(bed_dir, netns, env)
    finally:
        subprocess.run([sys.executable, TESTBED, "ec2", "down", "--dir", str(bed_dir)],
                       timeout=300)
        shutil.rmtree(bed_dir, ignore_errors=True)


__all__ = ["EC2Bed", "cloud_name", "ec2_bed", "running"]
