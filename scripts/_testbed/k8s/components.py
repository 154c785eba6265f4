"""The bed's processes outside its nodes - the controller (API proxy), etcd, the API server, the
controller-manager, the scheduler and kube-proxy - each started by the command line in the
bed's network namespace (`ip netns exec`, which execs: the pid recorded is the process's),
detached, logging to DIR/logs/NAME.log, and stopped by that pid. A pid counts as the bed's
only while its command line still names the bed's directory. Standard library only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

from _testbed.common import KILLED, Failure, kill_pids, pid_alive, proc_cmdline, read_text
from _testbed.common.control import request
from _testbed.k8s.layout import (
    APISERVER_PORT,
    APISERVER_URL,
    BED_IP,
    CONTROLLER_MODULE,
    ETCD_PEER_PORT,
    ETCD_PORT,
    LOOPBACK,
    NODE_PORT_RANGE,
    SCRIPTS,
    SERVICE_CIDR,
    SUBNET,
    BedPaths,
)

# In the order they start (and the reverse of the order they stop).
ORDER = ("controller", "etcd", "apiserver", "controller-manager", "scheduler", "kube-proxy")
STOP_WAIT_S = 10.0
# How long after its last heartbeat a node is NotReady, and how long pods tolerate that before
# they are evicted: short, so a lost node shows within seconds, not minutes.
NODE_GRACE = "16s"
TOLERATION_S = "20"


def command(name: str, paths: BedPaths, bin_dir: str, first_node: str) -> list[str]:
    """The command line of a component (pure: from paths and names only)."""
    pki = paths.pki

    def b(tool: str) -> str:
        return os.path.join(bin_dir, tool)

    if name == "controller":
        return [sys.executable, "-m", CONTROLLER_MODULE, "--dir", paths.dir]
    if name == "etcd":
        return [b("etcd"), "--name", "clusterd-testbed", "--data-dir", paths.etcd_data,
                "--listen-client-urls", f"http://{LOOPBACK}:{ETCD_PORT}",
                "--advertise-client-urls", f"http://{LOOPBACK}:{ETCD_PORT}",
                "--listen-peer-urls", f"http://{LOOPBACK}:{ETCD_PEER_PORT}",
                "--initial-advertise-peer-urls", f"http://{LOOPBACK}:{ETCD_PEER_PORT}",
                "--initial-cluster", f"clusterd-testbed=http://{LOOPBACK}:{ETCD_PEER_PORT}",
                "--listen-metrics-urls", "", "--log-level", "warn", "--logger", "zap"]
    if name == "apiserver":
        return [b("kube-apiserver"), f"--etcd-servers=http://{LOOPBACK}:{ETCD_PORT}",
                f"--bind-address={LOOPBACK}", f"--secure-port={APISERVER_PORT}",
                f"--advertise-address={BED_IP}", "--insecure-port=0",
                f"--tls-cert-file={pki}/apiserver.crt",
                f"--tls-private-key-file={pki}/apiserver.key",
                f"--client-ca-file={pki}/ca.crt", f"--token-auth-file={paths.tokens}",
                "--authorization-mode=Node,RBAC", "--anonymous-auth=false",
                f"--service-cluster-ip-range={SERVICE_CIDR}",
                f"--service-node-port-range={NODE_PORT_RANGE}",
                f"--service-account-key-file={pki}/sa.pub",
                f"--service-account-signing-key-file={pki}/sa.key",
                "--service-account-issuer=https://kubernetes.default.svc.cluster.local",
                f"--kubelet-client-certificate={pki}/apiserver-kubelet-client.crt",
                f"--kubelet-client-key={pki}/apiserver-kubelet-client.key",
                "--kubelet-preferred-address-types=InternalIP,Hostname",
                "--allow-privileged=true", "--profiling=false",
                f"--default-not-ready-toleration-seconds={TOLERATION_S}",
                f"--default-unreachable-toleration-seconds={TOLERATION_S}",
                f"--cert-dir={pki}/apiserver-certs", "--v=1"]
    if name == "controller-manager":
        return [b("kube-controller-manager"),
                f"--kubeconfig={paths.component_kubeconfig('controller-manager')}",
                "--controllers=*", "--leader-elect=false", "--port=0", "--secure-port=0",
                "--use-service-account-credentials=true",
                f"--service-account-private-key-file={pki}/sa.key",
                f"--root-ca-file={pki}/ca.crt",
                f"--cluster-signing-cert-file={pki}/ca.crt",
                f"--cluster-signing-key-file={pki}/ca.key",
                f"--flex-volume-plugin-dir={paths.flexvolume}",
                "--node-monitor-period=2s", f"--node-monitor-grace-period={NODE_GRACE}",
                "--profiling=false", "--v=1"]
    if name == "scheduler":
        return [b("kube-scheduler"),
                f"--kubeconfig={paths.component_kubeconfig('scheduler')}",
                "--leader-elect=false", "--port=0", "--secure-port=0", "--profiling=false",
                "--v=1"]
    if name == "kube-proxy":
        # One for all nodes: they share the bed's network namespace, where its rules live.
        return [b("kube-proxy"), f"--kubeconfig={paths.component_kubeconfig('kube-proxy')}",
                "--proxy-mode=iptables", f"--hostname-override={first_node}",
                f"--bind-address={BED_IP}", f"--cluster-cidr={SUBNET}",
                f"--nodeport-addresses={SUBNET}", "--conntrack-max-per-core=0",
                "--conntrack-tcp-timeout-established=0",
                "--conntrack-tcp-timeout-close-wait=0",
                f"--metrics-bind-address={LOOPBACK}:10249",
                f"--healthz-bind-address={LOOPBACK}:10256", "--v=1"]
    raise ValueError(f"no component {name}")


def is_ours(pid: Any, paths: BedPaths) -> bool:
    return isinstance(pid, int) and pid > 1 and pid_alive(pid) and \
        paths.dir in proc_cmdline(pid)


def start(name: str, paths: BedPaths, netns: str, bin_dir: str,
          first_node: str) -> int:
    os.makedirs(paths.logs, exist_ok=True)
    cmd = command(name, paths, bin_dir, first_node)
    with open(paths.log(name), "ab") as log:
        log.write(f"--- testbed: starting {name} at {time.strftime('%Y-%m-%d %H:%M:%S')}\n"
                  .encode())
        log.flush()
        env = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "LANG": "C.UTF-8", "HOME": paths.dir, "PYTHONPATH": SCRIPTS}
        proc = subprocess.Popen(["ip", "netns", "exec", netns, *cmd], stdin=subprocess.DEVNULL,
                                stdout=log, stderr=log, cwd=paths.dir, env=env,
                                start_new_session=True, close_fds=True)
    return proc.pid


def stop(pid: Any, paths: BedPaths, wait_s: float = STOP_WAIT_S) -> None:
    """SIGTERM the component (if it is still the bed's), then SIGKILL after wait_s."""
    if not is_ours(pid, paths):
        return
    KILLED.append(pid)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait_s
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    if pid_alive(pid):
        kill_pids([pid], wait_s=0)


def last_line(path: str) -> str:
    lines = (read_text(path) or "").strip().splitlines()
    return lines[-1].strip()[:400] if lines else f"({path} is empty)"


def wait_until(what: str, check: Callable[[], bool], pid: int, log_path: str,
               timeout: float) -> float:
    """Poll check until true; Failure naming the log if the process dies or time runs out.
    Returns the seconds it took."""
    start_t = time.monotonic()
    while True:
        if not pid_alive(pid):
            raise Failure(f"{what} exited while starting: {last_line(log_path)}",
                          hint=f"see {log_path}")
        with contextlib.suppress(Failure):
            if check():
                return time.monotonic() - start_t
        if time.monotonic() - start_t > timeout:
            raise Failure(f"{what} was not ready after {timeout:.0f}s: {last_line(log_path)}",
                          hint=f"see {log_path}")
        time.sleep(0.1)


class Api:
    """Calls to the API server (as the admin, directly, not through the fault proxy) made by
    the controller inside the namespace."""

    def __init__(self, paths: BedPaths, token: str) -> None:
        self.paths, self.token = paths, token

    def call(self, method: str, path: str, body: Any = None,
             content_type: str | None = None, timeout: float = 40) -> tuple[int, str]:
        got = request(self.paths.control_sock, "http", timeout=timeout, method=method,
                      url=APISERVER_URL + path, token=self.token, body=body,
                      content_type=content_type)
        return int(got["status"]), str(got["body"])

    def ok(self, method: str, path: str, body: Any = None, content_type: str | None = None,
           allow: tuple[int, ...] = ()) -> str:
        status, text = self.call(method, path, body, content_type)
        if not 200 <= status < 300 and status not in allow:
            raise Failure(f"{method} {path}: {status} {text[:500]}")
        return text

    def cluster(self) -> dict[str, Any]:
        return request(self.paths.control_sock, "cluster", timeout=40, url=APISERVER_URL,
                       token=self.token)
