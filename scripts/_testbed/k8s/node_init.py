"""PID 1 of a Kubernetes bed node: run by the command line as
`nsenter --net=/run/netns/NAME -- unshare --pid --fork --mount --mount-proc
--kill-child=SIGKILL -- python -m _testbed.k8s.node_init --config NODE/etc/node.json`, as root,
in the bed's network namespace and in a PID and mount namespace of the node's own.

It makes the node's mounts: its own /var/lib, /var/log and /run (the node's lib, log and run
directories: every host path the kubelet and containerd hard-code - /var/lib/kubelet,
/var/lib/cni, /var/log/pods, /var/log/containers, /run/containerd - is the node's), and a /sys
of the bed's network namespace with the machine's cgroup hierarchies kept under it. Then it
starts containerd, imports the bed's images, starts the kubelet, and reaps every orphan
(containerd's shims among them). When either of the two exits, the node goes down; when this
process dies, the kernel kills every process of the node (its pods too): a lost node.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from typing import Any

CONTAINERD_SOCK = "/run/containerd/containerd.sock"
CONTAINERD_WAIT_S = 60.0
IMPORT_TIMEOUT_S = 300.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def say(msg: str) -> None:
    print(f"{time.strftime('%H:%M:%S')} node_init: {msg}", file=sys.stderr, flush=True)


def sh(*cmd: str, timeout: float = 60.0) -> None:
    p = subprocess.run(list(cmd), stdin=subprocess.DEVNULL, capture_output=True, text=True,
                       timeout=timeout)
    if p.returncode != 0:
        raise SystemExit(f"node_init: {' '.join(cmd)} failed: {(p.stderr or p.stdout).strip()}")


def make_mounts(cfg: dict[str, Any]) -> None:
    # Nothing mounted here shows up on the machine or on another node.
    sh("mount", "--make-rprivate", "/")
    # sysfs shows the network namespace of whoever mounts it: the bed's, from now on. The
    # cgroup hierarchies under it are the machine's; keep them across the new /sys.
    hold = cfg["cgroup_hold"]
    os.makedirs(hold, exist_ok=True)
    sh("mount", "--rbind", "/sys/fs/cgroup", hold)
    sh("mount", "-t", "sysfs", "-o", "nosuid,nodev,noexec", "sysfs", "/sys")
    sh("mount", "--move", hold, "/sys/fs/cgroup")
    for source, target in (("lib", "/var/lib"), ("log", "/var/log"), ("run", "/run")):
        os.makedirs(cfg[source], exist_ok=True)
        sh("mount", "--bind", cfg[source], target)
    for d in ("/var/log/pods", "/var/log/containers", "/var/lib/kubelet", "/run/containerd"):
        os.makedirs(d, exist_ok=True)


def start(cmd: list[str], log_path: str) -> subprocess.Popen[bytes]:
    with open(log_path, "ab") as log:
        log.write(f"--- node_init: starting at {time.strftime('%Y-%m-%d %H:%M:%S')}: "
                  f"{' '.join(cmd)}\n".encode())
        log.flush()
        return subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                cwd="/", env={"PATH": PATH, "LANG": "C.UTF-8", "HOME": "/root"})


def wait_socket(path: str, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + CONTAINERD_WAIT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"node_init: containerd exited ({proc.returncode}) while starting")
        with socket.socket(socket.AF_UNIX) as s:
            try:
                s.connect(path)
                return
            except OSError:
                pass
        time.sleep(0.05)
    raise SystemExit(f"node_init: containerd did not listen on {path} in time")


def import_images(cfg: dict[str, Any]) -> None:
    ctr = [os.path.join(cfg["bin"], "ctr"), "--address", CONTAINERD_SOCK, "--namespace",
           "k8s.io"]
    for archive in cfg["images"]:
        t = time.monotonic()
        sh(*ctr, "images", "import", archive, timeout=IMPORT_TIMEOUT_S)
        say(f"imported {os.path.basename(archive)} in {time.monotonic() - t:.1f}s")


def serve(containerd: subprocess.Popen[bytes], kubelet: subprocess.Popen[bytes]) -> int:
    """Reap every child (we are PID 1) until containerd or the kubelet exits."""
    def stop(signum: int, frame: object) -> None:
        for p in (kubelet, containerd):
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGTERM)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    watched = {containerd.pid: "containerd", kubelet.pid: "kubelet"}
    while True:
        try:
            pid, status = os.waitpid(-1, 0)
        except ChildProcessError:
            return 1
        except InterruptedError:
            continue
        if pid in watched:
            say(f"{watched[pid]} exited ({os.waitstatus_to_exitcode(status)}); "
                f"the node goes down")
            return 1


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="node_init")
    ap.add_argument("--config", required=True, help="the node's node.json")
    args = ap.parse_args(argv)
    with open(args.config) as f:
        cfg = json.load(f)
    if os.getpid() != 1:
        raise SystemExit("node_init: must be PID 1 of its own PID namespace (run by unshare)")
    say(f"booting node {cfg['name']} ({cfg['ip']})")
    make_mounts(cfg)
    containerd = start([os.path.join(cfg["bin"], "containerd"), "--config",
                        cfg["containerd_config"]], cfg["containerd_log"])
    wait_socket(CONTAINERD_SOCK, containerd)
    say(f"containerd answers (pid {containerd.pid} in the node)")
    import_images(cfg)
    kubelet = start([os.path.join(cfg["bin"], "kubelet"), *cfg["kubelet_args"]],
                    cfg["kubelet_log"])
    say(f"kubelet started (pid {kubelet.pid} in the node)")
    return serve(containerd, kubelet)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
