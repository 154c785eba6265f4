"""The ssh test bed for end-to-end tests: real sshd hosts on 127.0.0.2-4 (scripts/testbed),
one Linux user each, and a daemon whose pool file lists them.

CLUSTERD_TEST_SSH_PREFIX and CLUSTERD_TEST_SSH_PORT (default `cdt` and 2322) name the hosts'
users and their port, so two test runs on one machine can keep out of each other's way."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import Daemon, make_env, short_tempdir

ROOT = Path(__file__).resolve().parents[2]
TESTBED = ROOT / "scripts" / "testbed"
PREFIX = os.environ.get("CLUSTERD_TEST_SSH_PREFIX") or "cdt"
PORT = int(os.environ.get("CLUSTERD_TEST_SSH_PORT") or 2322)


@dataclasses.dataclass
class Bed:
    dir: Path
    hosts: list[dict[str, Any]]
    daemon: Daemon

    @property
    def key(self) -> str:
        return str(self.dir / "id_ed25519")

    @property
    def pools_file(self) -> Path:
        return Path(self.daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "ssh_node_pools.yaml"

    def ssh(self, index: int, command: str) -> subprocess.CompletedProcess[str]:
        """Run a command on host `index` (0-based) as its user, with plain OpenSSH."""
        host = self.hosts[index]
        return subprocess.run(
            ["ssh", "-i", self.key, "-p", str(host["port"]), "-o", "BatchMode=yes",
             "-o", "StrictHostKeyChecking=no", "-o", "UserKnownHostsFile=/dev/null",
             "-o", "LogLevel=ERROR", f"{host['user']}@{host['ip']}", command],
            capture_output=True, text=True, timeout=60,
        )

    def user_pids(self, index: int) -> set[int]:
        out = subprocess.run(["ps", "-o", "pid=,comm=", "-u", self.hosts[index]["user"]],
                             capture_output=True, text=True).stdout
        return {int(line.split()[0]) for line in out.splitlines()
                if line.split() and "sshd" not in line}

    def price_pool(self, price_per_hour: float) -> None:
        """The pool's `price_per_hour` (per host), as a user sets it in the pools file."""
        pools = yaml.safe_load(self.pools_file.read_text())
        pools["testbed"]["price_per_hour"] = price_per_hour
        self.pools_file.write_text(yaml.safe_dump(pools))

    def up(self, count: int = 3) -> None:
        """`scripts/testbed up` again (it keeps running hosts, starts missing ones)."""
        up = subprocess.run([sys.executable, str(TESTBED), "up", str(count), "--dir",
                             str(self.dir), "--prefix", PREFIX, "--port", str(PORT),
                             "--pools-file", str(self.pools_file)],
                            capture_output=True, text=True, timeout=120)
        assert up.returncode == 0, up.stderr

    def runtime(self, cluster: str) -> tuple[str, dict[str, Any]]:
        """A cluster's cloud name and runtime handle, from the daemon's database."""
        db = sqlite3.connect(self.daemon.state_dir / "state.db")
        try:
            cloud_name, handle = db.execute(
                "SELECT cloud_name, handle FROM clusters WHERE name = ?", [cluster]).fetchone()
        finally:
            db.close()
        return cloud_name, json.loads(handle)["runtime"]


@contextlib.contextmanager
def ssh_bed(count: int = 3) -> Iterator[Bed]:
    if os.getuid() != 0 or not Path("/usr/sbin/sshd").exists():
        pytest.skip("the test bed needs root and openssh-server")
    root = short_tempdir("cdssh-")
    env = make_env(root)
    home = root / "home"
    home.mkdir()
    env["HOME"] = str(home)  # ssh config includes go to a home of the test's own
    bed = Bed(root / "bed", [], Daemon(root, env))
    try:
        bed.up(count)
        bed.hosts = json.loads((bed.dir / "hosts.json").read_text())
        bed.daemon.start()
        yield bed
    finally:
        try:
            bed.daemon.down_all()
            if bed.daemon.process is not None:
                bed.daemon.stop()
        finally:
            subprocess.run([sys.executable, str(TESTBED), "down", "--dir", str(bed.dir),
                            "--pools-file", str(bed.pools_file)], timeout=120)
            shutil.rmtree(root, ignore_errors=True)


def restart_agent(bed: Bed, cluster: str) -> None:
    """Restart the head's agent as its node user would (so it loads the code on disk); the
    node helper takes the token from the file it keeps."""
    cloud_name, runtime = bed.runtime(cluster)
    base = f"/home/{PREFIX}1/.clusterd/clusters/{cloud_name}"
    ports = runtime["ports"]
    params = {
        "dir": f"{base}/run", "listen": runtime["agent_listen"], "state_dir": f"{base}/agent",
        "ray_address": runtime["ray_address"], "cluster_name": cluster,
        "env": {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": f"{base}/ray_token",
                "AUTOSCALER_METRIC_PORT": str(ports["autoscaler_metric_port"]),
                "DASHBOARD_METRIC_PORT": str(ports["dashboard_metric_port"])},
    }
    helper = ".clusterd/current/bin/python -m clusterd.agent.node"
    stop = bed.ssh(0, f"{helper} stop - <<'EOF'\n" +
                   json.dumps({"dir": params["dir"], "parts": ["agent"]}) + "\nEOF")
    assert stop.returncode == 0, stop.stderr
    start = bed.ssh(0, f"{helper} start-agent - <<'EOF'\n{json.dumps(params)}\nEOF")
    assert start.returncode == 0 and "error" not in start.stdout, start.stdout + start.stderr


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


# What another user of the head may try, as plain system Python (it reads nothing of ours):
# connect to each socket, read each file, list each directory; then, with gRPC and Ray from
# the cluster's own venv (readable, as code is), call the agent's API on every TCP port the
# agent's process has (Ray's own, in that process: it is a Ray driver), and join the cluster's
# Ray as a driver (the way to run code as the cluster's user).
PROBE = """
import errno, json, os, socket, subprocess, sys
spec = json.loads(sys.argv[1])
found = {}
def outcome(action, what):
    try:
        action(what)
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))
for path in spec["sockets"]:
    found[path] = outcome(lambda p: socket.socket(socket.AF_UNIX).connect(p), path)
for path in spec["files"]:
    found[path] = outcome(lambda p: open(p, "rb").read(), path)
for path in spec["dirs"]:
    found[path] = outcome(os.listdir, path)
for name in ("grpc", "ray"):
    done = subprocess.run([spec["python"], "-c", spec[name], json.dumps(spec)],
                          capture_output=True, text=True, timeout=150)
    found[name] = [done.returncode, done.stdout[-2000:], done.stderr[-1500:]]
print(json.dumps(found))
"""
GRPC_PROBE = """
import grpc, json, sys
spec = json.loads(sys.argv[1])
codes = {}
for port in spec["tcp"]:
    channel = grpc.insecure_channel(f"{spec['host']}:{port}")
    for method in ("JobsService/GetJobQueue", "JobsService/AddJob", "HealthService/GetHealth"):
        call = channel.unary_unary(f"/clusterd.agent.v1.{method}")
        try:
            call(b"", timeout=5)
            codes[f"{port} {method}"] = "OK"
        except grpc.RpcError as exc:
            codes[f"{port} {method}"] = exc.code().name
    channel.close()
print(json.dumps(codes))
"""
RAY_DRIVER = """
import json, sys
import ray
ray.init(address=json.loads(sys.argv[1])["ray_address"], log_to_driver=False)
@ray.remote
def whoami():
    import getpass
    return getpass.getuser()
print("RAN AS", ray.get(whoami.remote(), timeout=30))
"""
