"""PID 1 of an EC2 node: run by the controller as `unshare --net --mount --pid --fork --mount-proc
--kill-child=SIGKILL -- python -m _testbed.ec2.node_init ...`, as root, in the node's own
network, PID and mount namespaces. It makes the node's mounts - the instance's disk (an ext4
image: disk.py) with its home on /home/ubuntu and its /tmp freshly emptied (a boot), a private
/dev/shm, the shutdown stubs on /usr/local/sbin, the instance's control directory on
/run/clusterd-testbed-node, a /sys of its own network namespace - and its network: `lo` with
127.0.0.1/32 only, and the instance's private address on the veth the controller hands it
(network.py). Then it runs sshd in the foreground, says it is up (a `ready` file in the control
directory, once sshd answers) and reaps every orphan until sshd exits. When this process dies,
the kernel kills every process of the node, and its namespace and veth go with them. Standard
library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import socket
import subprocess
import sys
import time

from _testbed.common import Failure, run
from _testbed.ec2 import disk, network
from _testbed.ec2.layout import NODE_READY

SSHD = "/usr/sbin/sshd"
MOUNT = "/bin/mount"
LINK_WAIT_S = 30.0
SSHD_WAIT_S = 30.0


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} node_init: {msg}", file=sys.stderr, flush=True)


def mount(*args: str) -> None:
    p = subprocess.run([MOUNT, *args], stdin=subprocess.DEVNULL, capture_output=True, text=True)
    if p.returncode != 0:
        raise SystemExit(f"node_init: mount {' '.join(args)} failed: {p.stderr.strip()}")


def empty_dir(path: str, mode: int) -> None:
    """path as an empty directory (a boot wipes /tmp)."""
    if os.path.isdir(path) and not os.path.islink(path):
        for name in os.listdir(path):
            p = os.path.join(path, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(p)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.makedirs(path)
    os.chown(path, 0, 0)
    os.chmod(path, mode)


def make_mounts(args: argparse.Namespace) -> None:
    # Nothing mounted here may show up on the host or on another node. The order matters: the
    # instance's directory may itself live under /tmp, so /tmp is covered last.
    mount("--make-rprivate", "/")
    try:
        disk.wait_released(args.disk)
    except Failure as e:
        raise SystemExit(f"node_init: {e}") from e
    mount("-o", disk.MOUNT_OPTIONS, args.disk, args.disk_mount)
    mount("--bind", args.control, args.node_mount)
    mount("--bind", args.sbin, "/usr/local/sbin")
    mount("-o", "remount,bind,ro", "/usr/local/sbin")
    mount("--bind", os.path.join(args.disk_mount, "home"), args.home_mount)
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    # sysfs shows the network namespace of whoever mounted it: the node's own, from now on.
    mount("-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", "/sys")
    tmp = os.path.join(args.disk_mount, "tmp")
    empty_dir(tmp, 0o1777)
    mount("--bind", tmp, "/tmp")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def make_network(ip: str, prefix: int) -> None:
    """The node's addresses, on the veth the controller hands it (it may come a moment after
    this process starts)."""
    link = f"/sys/class/net/{network.NODE_LINK}"
    deadline = time.monotonic() + LINK_WAIT_S
    while not os.path.exists(link):
        if time.monotonic() > deadline:
            raise SystemExit(f"node_init: the bed gave this node no {network.NODE_LINK} within "
                             f"{LINK_WAIT_S:.0f}s")
        time.sleep(0.01)
    try:
        network.loopback_only_localhost()
        for name in ("all", "default", network.NODE_LINK):
            network.set_sysctl(f"net/ipv4/conf/{name}/route_localnet", "1")
        run(["ip", "addr", "add", f"{ip}/{prefix}", "dev", network.NODE_LINK])
        run(["ip", "link", "set", network.NODE_LINK, "up"])
        network.node_routes(ip, prefix)
    except (Failure, OSError) as e:
        raise SystemExit(f"node_init: setting up the network failed: {e}") from e
    say(f"network: {ip}/{prefix} on {network.NODE_LINK}")


def sshd_answers(ip: str) -> bool:
    try:
        with socket.create_connection((ip, 22), timeout=1) as sock:
            sock.settimeout(1)
            return sock.recv(4).startswith(b"SSH-")
    except OSError:
        return False


def say_ready(ip: str, ready_file: str, sshd: subprocess.Popen[bytes]) -> None:
    """Write ready_file once sshd answers (from inside the node: the instance's security groups
    do not stand between the bed and a node's own health)."""
    deadline = time.monotonic() + SSHD_WAIT_S
    while sshd.poll() is None and time.monotonic() < deadline:
        if sshd_answers(ip):
            with open(ready_file + ".tmp", "w") as f:
                f.write(f"{time.time()}\n")
            os.replace(ready_file + ".tmp", ready_file)
            say("sshd answers: ready")
            return
        time.sleep(0.05)
    say("sshd did not answer in time; not ready")


def serve(sshd_config: str, ip: str, ready_file: str) -> int:
    """Run sshd in the foreground; reap every child (we are PID 1) until sshd exits."""
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", sshd_config], stdin=subprocess.DEVNULL,
                            cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                          "LANG": "C.UTF-8"})
    say(f"sshd started (pid {sshd.pid} in the node)")
    say_ready(ip, ready_file, sshd)

    def stop(signum: int, frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(sshd.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid == sshd.pid:
            code = os.waitstatus_to_exitcode(status)
            say(f"sshd exited ({code}); the node goes down")
            return 1 if code == 0 else abs(code)


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="node_init")
    ap.add_argument("--instance-id", required=True)
    ap.add_argument("--disk", required=True, help="the instance's disk image (disk.py)")
    ap.add_argument("--disk-mount", required=True, help="where the node mounts it")
    ap.add_argument("--control", required=True)
    ap.add_argument("--sbin", required=True, help="the shutdown stubs")
    ap.add_argument("--node-mount", required=True)
    ap.add_argument("--home-mount", required=True)
    ap.add_argument("--sshd-config", required=True, help="its path on the node")
    ap.add_argument("--ip", required=True, help="the instance's private address")
    ap.add_argument("--prefix", type=int, required=True, help="its VPC's prefix length")
    args = ap.parse_args(argv)
    if os.getpid() != 1:
        raise SystemExit("node_init: must be PID 1 of its own PID namespace (run by unshare)")
    say(f"booting {args.instance_id}")
    make_mounts(args)
    make_network(args.ip, args.prefix)
    return serve(args.sshd_config, args.ip, os.path.join(args.node_mount, NODE_READY))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
