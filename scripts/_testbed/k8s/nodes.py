"""The bed's nodes from the command line's side: their files, starting one (node_init as PID 1
of a PID and mount namespace of its own, in the bed's network namespace), finding its kubelet,
killing it (a lost node), waiting for Ready, and the fake GPUs (an extended resource in the
node's status, put back whenever the kubelet registers anew). Standard library only."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from typing import Any

from _testbed.common import KILLED, Failure, pid_alive, proc_cmdline, write_file
from _testbed.k8s import host, render
from _testbed.k8s.components import Api, last_line
from _testbed.k8s.layout import (
    GPU_RESOURCE,
    NODE_INIT_MODULE,
    SCRIPTS,
    BedPaths,
    NodeSpec,
    pause_image,
)

READY_TIMEOUT_S = 240.0
RESOLV_CONF = "# the clusterd Kubernetes test bed: no DNS (its namespace has no link out)\n"


def kubelet_args(node: NodeSpec, paths: BedPaths) -> list[str]:
    np = paths.node(node.name)
    labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
    return [f"--config={np.kubelet_config}", f"--kubeconfig={np.kubeconfig}",
            f"--hostname-override={node.name}", f"--node-ip={node.ip}",
            "--container-runtime=remote",
            "--container-runtime-endpoint=unix:///run/containerd/containerd.sock",
            "--image-service-endpoint=unix:///run/containerd/containerd.sock",
            f"--pod-infra-container-image={pause_image()}", f"--node-labels={labels}",
            "--root-dir=/var/lib/kubelet", "--cert-dir=/var/lib/kubelet/pki", "--v=1"]


def write_node_files(node: NodeSpec, paths: BedPaths, netns: str, bin_dir: str,
                     images: list[str]) -> str:
    """Everything node_init and the node's programs read; returns node.json's path. The
    node's previous run directories go: a restarted node is a new machine of the same name."""
    np = paths.node(node.name)
    for d in (np.lib, np.log_dir, np.run):
        shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d)
    os.makedirs(np.cni_dir, exist_ok=True)
    write_file(os.path.join(np.cni_dir, "10-clusterd-testbed.conflist"), render.cni_config(node))
    write_file(np.containerd_config, render.containerd_config(node, pause_image(), np.cni_dir))
    write_file(np.resolv_conf, RESOLV_CONF)
    write_file(np.kubelet_config, render.kubelet_config(
        node, host.node_cgroup_root(netns, node.name), os.path.join(paths.pki, "ca.crt"),
        np.resolv_conf))
    cfg = {"name": node.name, "ip": node.ip, "bin": bin_dir, "images": images,
           "lib": np.lib, "log": np.log_dir, "run": np.run, "cgroup_hold": np.cgroup_hold,
           "containerd_config": np.containerd_config, "containerd_log": np.containerd_log,
           "kubelet_log": np.kubelet_log, "kubelet_args": kubelet_args(node, paths)}
    path = os.path.join(np.etc, "node.json")
    write_file(path, json.dumps(cfg, indent=2) + "\n")
    return path


def start(node: NodeSpec, paths: BedPaths, netns: str, bin_dir: str,
          images: list[str]) -> int:
    """Boot the node; returns the pid to kill it by (unshare's: its death kills the node)."""
    config = write_node_files(node, paths, netns, bin_dir, images)
    host.ensure_cgroup_root(netns, node.name)
    np = paths.node(node.name)
    with open(np.node_log, "ab") as log:
        log.write(f"--- testbed: booting {node.name} at "
                  f"{time.strftime('%Y-%m-%d %H:%M:%S')}\n".encode())
        log.flush()
        proc = subprocess.Popen(
            ["nsenter", f"--net=/run/netns/{netns}", "--", "unshare", "--pid", "--fork",
             "--mount", "--mount-proc", "--kill-child=SIGKILL", "--",
             sys.executable, "-m", NODE_INIT_MODULE, "--config", config],
            stdin=subprocess.DEVNULL, stdout=log, stderr=log, cwd="/", start_new_session=True,
            env={"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                 "PYTHONPATH": SCRIPTS, "LANG": "C.UTF-8"})
    return proc.pid


def is_node(pid: Any, paths: BedPaths, name: str) -> bool:
    """pid is alive and is the unshare of that node of this bed."""
    if not isinstance(pid, int) or pid <= 1 or not pid_alive(pid):
        return False
    cmdline = proc_cmdline(pid)
    return NODE_INIT_MODULE in cmdline and paths.node(name).etc in cmdline


def kill(pid: Any, paths: BedPaths, name: str) -> bool:
    """SIGKILL the node's unshare: its PID 1 gets SIGKILL too, and the kernel kills every
    process of the node. True if it was alive."""
    if not is_node(pid, paths, name):
        return False
    KILLED.append(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return True


def _children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def processes(pid: Any) -> dict[str, int]:
    """{"init": pid, "kubelet": pid, "containerd": pid} of a node, as this machine numbers
    them (found through the node's PID namespace)."""
    out: dict[str, int] = {}
    if not isinstance(pid, int):
        return out
    inits = _children(pid)
    if not inits:
        return out
    out["init"] = inits[0]
    for child in _children(inits[0]):
        try:
            with open(f"/proc/{child}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in ("kubelet", "containerd"):
            out[comm] = child
    return out


def rss_kb(pid: int | None) -> int | None:
    if not pid:
        return None
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def wait_ready(api: Api, paths: BedPaths, pids: dict[str, int], timeout: float = READY_TIMEOUT_S,
               ) -> dict[str, float]:
    """Until every node named in pids is Ready; {name: seconds it took}. A node whose
    processes die says why, plainly (the kubelet cannot run here: no fallback)."""
    start_t = time.monotonic()
    took: dict[str, float] = {}
    while len(took) < len(pids):
        for name, pid in pids.items():
            if name not in took and not pid_alive(pid):
                np = paths.node(name)
                raise Failure(
                    f"node {name} went down while starting, so the real kubelet cannot run "
                    f"on this machine as the bed runs it: {last_line(np.node_log)} / kubelet: "
                    f"{last_line(np.kubelet_log)} / containerd: {last_line(np.containerd_log)}",
                    hint=f"see {np.kubelet_log}, {np.containerd_log} and {np.node_log}")
        with contextlib.suppress(Failure):
            for node in api.cluster()["nodes"]:
                if node["name"] in pids and node["ready"] and node["name"] not in took:
                    took[node["name"]] = time.monotonic() - start_t
        if time.monotonic() - start_t > timeout:
            late = sorted(set(pids) - set(took))
            np = paths.node(late[0])
            raise Failure(f"node(s) {', '.join(late)} not Ready after {timeout:.0f}s: the "
                          f"kubelet says {last_line(np.kubelet_log)}",
                          hint=f"see {np.kubelet_log}")
        time.sleep(0.25)
    return took


def import_image(paths: BedPaths, name: str, bin_dir: str, image: str, archive: str) -> bool:
    """Import an image into a running node's containerd (through its socket, which is in the
    node's run directory), unless it has it. True if it imported it."""
    ctr = [os.path.join(bin_dir, "ctr"), "--address",
           os.path.join(paths.node(name).run, "containerd", "containerd.sock"),
           "--namespace", "k8s.io", "images"]
    have = subprocess.run([*ctr, "ls", "-q", f"name=={image}"], capture_output=True,
                          text=True, timeout=60, stdin=subprocess.DEVNULL)
    if have.returncode == 0 and have.stdout.strip():
        return False
    done = subprocess.run([*ctr, "import", archive], capture_output=True, text=True,
                          timeout=900, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise Failure(f"importing {image} into node {name} failed: "
                      f"{(done.stderr or done.stdout).strip()[-500:]}")
    return True


def ensure_gpus(api: Api, node: NodeSpec) -> bool:
    """The node's GPUs in its status (capacity and allocatable), if they are not there now.
    True if it patched them."""
    status, text = api.call("GET", f"/api/v1/nodes/{node.name}")
    if status != 200:
        raise Failure(f"cannot read node {node.name}: {status} {text[:300]}")
    capacity = json.loads(text).get("status", {}).get("capacity", {})
    if capacity.get(GPU_RESOURCE) == str(node.gpus):
        return False
    api.ok("PATCH", f"/api/v1/nodes/{node.name}/status", render.gpu_capacity_patch(node.gpus),
           "application/json-patch+json")
    return True
