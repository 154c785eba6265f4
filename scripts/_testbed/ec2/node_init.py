"""PID 1 of an EC2 node: run by the controller as
`unshare --mount --pid --fork --mount-proc --kill-child=SIGKILL -- python -m
_testbed.ec2.node_init ...`, as root, in the node's own PID and mount namespaces (the network
namespace is the bed's). It makes the node's mounts - the instance's disk on /home/ubuntu, a
freshly emptied /tmp (a boot), a private /dev/shm, the shutdown stubs on /usr/local/sbin, the
instance's control directory on /run/clusterd-testbed-node - then runs sshd in the foreground and
reaps every orphan until sshd exits. When this process dies, the kernel kills every process of
the node. Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import subprocess
import sys
import time

SSHD = "/usr/sbin/sshd"
MOUNT = "/bin/mount"


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
    mount("--bind", args.control, args.node_mount)
    mount("--bind", args.sbin, "/usr/local/sbin")
    mount("-o", "remount,bind,ro", "/usr/local/sbin")
    mount("--bind", args.home, args.home_mount)
    mount("-t", "tmpfs", "-o", "mode=1777,nosuid,nodev", "tmpfs", "/dev/shm")
    empty_dir(args.tmp, 0o1777)
    mount("--bind", args.tmp, "/tmp")
    os.makedirs("/run/sshd", mode=0o755, exist_ok=True)


def serve(sshd_config: str) -> int:
    """Run sshd in the foreground; reap every child (we are PID 1) until sshd exits."""
    sshd = subprocess.Popen([SSHD, "-D", "-e", "-f", sshd_config], stdin=subprocess.DEVNULL,
                            cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
                                          "LANG": "C.UTF-8"})
    say(f"sshd started (pid {sshd.pid} in the node)")

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
    ap.add_argument("--home", required=True, help="the instance's disk")
    ap.add_argument("--tmp", required=True)
    ap.add_argument("--control", required=True)
    ap.add_argument("--sbin", required=True, help="the shutdown stubs")
    ap.add_argument("--node-mount", required=True)
    ap.add_argument("--home-mount", required=True)
    ap.add_argument("--sshd-config", required=True, help="its path on the node")
    args = ap.parse_args(argv)
    if os.getpid() != 1:
        raise SystemExit("node_init: must be PID 1 of its own PID namespace (run by unshare)")
    say(f"booting {args.instance_id}")
    make_mounts(args)
    return serve(args.sshd_config)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
