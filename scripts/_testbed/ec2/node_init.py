"""PID 1 of an EC2 node: run by the controller as `unshare --net --mount --pid --fork --mount-proc
--kill-child=SIGKILL -- python -m _testbed.ec2.node_init ...`, as root, in the node's own
network, PID and mount namespaces. It makes the node's mounts - the instance's disk (an ext4
image: disk.py) with its home on /home/ubuntu and its /tmp freshly emptied (a boot), a private
/dev/shm, the shutdown stubs on /usr/local/sbin, the instance's control directory on
/run/clusterd-testbed-node, a /sys of its own network namespace - and its network: `lo` with
127.0.0.1/32 only, and the instance's private address on the veth the controller hands it
(network.py). Then it runs sshd in the foreground, says it is up (a `ready` file in the control
directory, once sshd answers) and reaps every orphan until sshd exits. When this process dies,
the kernel kills every process of the node, and its namespace and veth go with them.

With --root (an image's root filesystem: images.py), the node runs in that root, not the
host's, as an EC2 instance runs its AMI: an overlay of the root (read-only, shared by every
instance of the image) under a writable layer on the instance's own disk, with its /proc,
/sys, /dev (a /dev/pts and /dev/shm of its own), an empty /run and the mounts above, made its
root by pivot_root (the host's root is then gone from the node's mount namespace), and the
image's own sshd. With --extra-bin, that directory's programs (the bed's driver stand-ins)
show in the node's /usr/local/bin. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import encodings.idna  # noqa: F401  (loaded before enter_root: see there)
import os
import platform
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
IMAGE_LAYER = "image"  # on the instance's disk: the writable layer over an image's root
PIVOT_ROOT_SYSCALL = {"x86_64": 155, "aarch64": 41}
MNT_DETACH = 2
TTY_GID = 5  # Debian's `tty` group: devpts gives new terminals to it


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


def make_mounts(args: argparse.Namespace) -> str | None:
    """The node's mounts; with an image root, the root made (make_root) and its path."""
    # Nothing mounted here may show up on the host or on another node. The order matters: the
    # instance's directory may itself live under /tmp, so /tmp is covered last.
    mount("--make-rprivate", "/")
    try:
        disk.wait_released(args.disk)
    except Failure as e:
        raise SystemExit(f"node_init: {e}") from e
    mount("-o", disk.MOUNT_OPTIONS, args.disk, args.disk_mount)
    # sysfs shows the network namespace of whoever mounted it: the node's own, from now on.
    mount("-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", "/sys")
    tmp = os.path.join(args.disk_mount, "tmp")
    empty_dir(tmp, 0o1777)
    if args.root:
        return make_root(args)
    mount("--bind", args.control, args.node_mount)
    mount("--bind", args.sbin, "/usr/local/sbin")
    mount("-o", "remount,bind,ro", "/usr/local/sbin")
    mount("--bind", os.path.join(args.disk_mount, "home"), args.home_mount)
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    if args.extra_bin:
        overlay_bin(args.extra_bin, "/usr/local/bin")
    mount("--bind", tmp, "/tmp")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)
    return None


def overlay_bin(extra: str, target: str) -> None:
    """extra's programs in target beside its own (a read-only overlay: no upper layer)."""
    mount("-t", "overlay", "overlay", "-o", f"lowerdir={extra}:{target}", target)


def make_root(args: argparse.Namespace) -> str:
    """The node's root: the image's root under a writable layer of the instance's disk, with
    the node's mounts on it (see the module's docstring). Returns where it is mounted."""
    layer = os.path.join(args.disk_mount, IMAGE_LAYER)
    upper, work, new = (os.path.join(layer, d) for d in ("upper", "work", "root"))
    for d in (upper, work, new):
        os.makedirs(d, mode=0o755, exist_ok=True)
    mount("-t", "overlay", "overlay", "-o",
          f"lowerdir={args.root},upperdir={upper},workdir={work}", new)

    def at(path: str, mode: int = 0o755) -> str:
        p = os.path.join(new, path.lstrip("/"))
        os.makedirs(p, mode=mode, exist_ok=True)
        return p

    mount("-t", "proc", "-o", "nosuid,nodev,noexec", "proc", at("/proc"))
    mount("-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", at("/sys"))
    mount("--rbind", "/dev", at("/dev"))
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", at("/dev/shm"))
    mount("-t", "devpts", "-o", f"newinstance,ptmxmode=0666,mode=0620,gid={TTY_GID}", "devpts",
          at("/dev/pts"))
    mount("--bind", os.path.join(new, "dev/pts/ptmx"), os.path.join(new, "dev/ptmx"))
    mount("-t", "tmpfs", "-o", "mode=0755,nosuid,nodev", "tmpfs", at("/run"))
    os.makedirs(os.path.join(new, "run/sshd"), mode=0o755)
    mount("--bind", args.control, at(args.node_mount))
    mount("--bind", args.sbin, at("/usr/local/sbin"))
    mount("-o", "remount,bind,ro", os.path.join(new, "usr/local/sbin"))
    mount("--bind", os.path.join(args.disk_mount, "home"), at(args.home_mount))
    mount("--bind", os.path.join(args.disk_mount, "tmp"), at("/tmp", 0o1777))
    if args.extra_bin:
        overlay_bin(args.extra_bin, at("/usr/local/bin"))
    # The machine's name resolves, as cloud-init makes it on EC2 (sudo asks for it), to the
    # instance's address. Written in the instance's own layer at each boot.
    with open(os.path.join(new, "etc/hosts"), "w") as f:
        f.write(f"127.0.0.1 localhost\n::1 localhost ip6-localhost ip6-loopback\n"
                f"{args.ip} {socket.gethostname()}\n")
    return new


def enter_root(new: str) -> None:
    """Make `new` this mount namespace's root and drop the host's (pivot_root(".", ".") then
    detach the old root stacked on it). Everything after this runs the image's programs, and
    this process can no longer import from the host's Python library: what it uses later is
    imported at the top (socket's host names need encodings.idna, which it loads lazily)."""
    number = PIVOT_ROOT_SYSCALL.get(platform.machine())
    if number is None:
        raise SystemExit(f"node_init: no pivot_root syscall number for {platform.machine()}")
    libc = ctypes.CDLL(None, use_errno=True)
    os.chdir(new)
    if libc.syscall(number, b".", b".") != 0:
        raise SystemExit(f"node_init: pivot_root failed: {os.strerror(ctypes.get_errno())}")
    if libc.umount2(b".", MNT_DETACH) != 0:
        raise SystemExit(f"node_init: detaching the host's root failed: "
                         f"{os.strerror(ctypes.get_errno())}")
    os.chdir("/")


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
    ap.add_argument("--root", help="the image's root filesystem (none: the host's)")
    ap.add_argument("--extra-bin", help="programs to show in the node's /usr/local/bin")
    args = ap.parse_args(argv)
    if os.getpid() != 1:
        raise SystemExit("node_init: must be PID 1 of its own PID namespace (run by unshare)")
    say(f"booting {args.instance_id}")
    new_root = make_mounts(args)
    make_network(args.ip, args.prefix)
    if new_root is not None:
        enter_root(new_root)
        say(f"running in the image root {args.root}")
    return serve(args.sshd_config, args.ip, os.path.join(args.node_mount, NODE_READY))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
