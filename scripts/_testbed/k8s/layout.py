"""Where the Kubernetes test bed keeps things, its addresses and names, its state file, and the
environment `exec` gives a command. Shared by the command line, the controller and node_init.
Standard library only."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
from collections.abc import Mapping
from typing import Any

from _testbed.common import Failure, read_text, write_file

# scripts/_testbed/k8s/layout.py -> the repository
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCRIPTS = os.path.join(REPO, "scripts")
VENV_BIN = os.path.join(REPO, ".venv", "bin")

DEFAULT_DIR = "/tmp/clusterd-k8s"
DEFAULT_NETNS = "clusterd-k8s"
DEFAULT_CACHE = "/var/cache/clusterd-testbed/k8s"
DIR_ENV, NETNS_ENV, CACHE_ENV = ("CLUSTERD_TESTBED_K8S_DIR", "CLUSTERD_TESTBED_K8S_NETNS",
                                 "CLUSTERD_TESTBED_K8S_CACHE")
# What `exec` adds to a command's environment besides KUBECONFIG (all named in the README).
ADMIN_KUBECONFIG_ENV = "CLUSTERD_TESTBED_K8S_ADMIN_KUBECONFIG"
NODE_IMAGE_ENV = "CLUSTERD_TESTBED_K8S_NODE_IMAGE"
RUNTIME_IMAGE_ENV = "CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE"
# clusterd's own setting: the pods' image where its config names none (the bed's).
CLUSTERD_IMAGE_ENV = "CLUSTERD_KUBERNETES_IMAGE"

# The network, all of it inside the bed's namespace: one bridge, a /16 for the bed's own
# address, the nodes' addresses and their pods; services on another /16 that only kube-proxy's
# rules know.
BRIDGE = "k8sbr0"
SUBNET = ipaddress.IPv4Network("10.77.0.0/16")
BED_IP = "10.77.0.1"  # the bed's own address on the bridge (the API server advertises it)
SERVICE_CIDR = "10.96.0.0/16"
KUBERNETES_SERVICE_IP = "10.96.0.1"
NODE_PORT_RANGE = "30000-32767"
LOOPBACK = "127.0.0.1"
ETCD_PORT, ETCD_PEER_PORT = 2379, 2380
APISERVER_PORT = 6444  # the API server itself: the bed's components and the admin context
API_PORT = 6443  # the fault proxy in front of it: what clusterd's contexts use
API_URL = f"https://{LOOPBACK}:{API_PORT}"
APISERVER_URL = f"https://{LOOPBACK}:{APISERVER_PORT}"
KUBELET_PORT = 10250

# The kubeconfig clusterd gets (KUBECONFIG in `exec`): two contexts, each its own namespace
# and user on the one control plane. bed-b's namespace has a ResourceQuota that can run out.
CLUSTER_NAME = "clusterd-testbed"
CONTEXTS = (("bed-a", "bed-a", "clusterd-a"), ("bed-b", "bed-b", "clusterd-b"))
QUOTA_CONTEXT = "bed-b"
QUOTA_NAME = "clusterd-testbed-quota"
DEFAULT_QUOTA = {"pods": "20", "requests.nvidia.com/gpu": "4"}
ADMIN_CONTEXT, ADMIN_USER = "bed-admin", "admin"

# Nodes: `cpu-I` and `gpu-J`. A node's index fixes its address and its pods' range for good, so
# nodes can be added later without renumbering any: cpu-I is I, gpu-J is GPU_INDEX_BASE + J.
MAX_NODES = 8
GPU_INDEX_BASE = 100
GPU_RESOURCE = "nvidia.com/gpu"
GPUS_PER_NODE = 2
GPU_NAME = "A100"  # SkyPilot's name for it
GPU_PRODUCT = "NVIDIA-A100-SXM4-80GB"  # as NVIDIA's GPU feature discovery labels it
GPU_LABELS = {"skypilot.co/accelerator": GPU_NAME.lower(),
              "nvidia.com/gpu.product": GPU_PRODUCT,
              "nvidia.com/gpu.count": str(GPUS_PER_NODE)}
POOL_LABEL = "clusterd.testbed/pool"
NODE_LABEL = "clusterd.testbed/node"

# Images: built here, imported into every node's containerd; pods pull nothing.
IMAGE_REPO = "docker.io/clusterd-testbed"
PAUSE_TAG = "3.4"
NODE_USER = "sky"  # the node image's login user (uid 1000, passwordless sudo)

STATE_FILE = "state.json"
CONTROLLER_MODULE = "_testbed.k8s.controller"
NODE_INIT_MODULE = "_testbed.k8s.node_init"
CGROUP_PREFIX = "clusterd-testbed-k8s"  # /sys/fs/cgroup/<h>/clusterd-testbed-k8s.NETNS/NODE


def default_dir() -> str:
    return os.environ.get(DIR_ENV) or DEFAULT_DIR


def default_netns() -> str:
    return os.environ.get(NETNS_ENV) or DEFAULT_NETNS


def cache_root() -> str:
    return os.path.abspath(os.environ.get(CACHE_ENV) or DEFAULT_CACHE)


def wheelhouse_dir(base: Mapping[str, str]) -> str:
    """Where `up` prepares the runtime's wheelhouse and daemons in the bed find it: base's
    CLUSTERD_WHEELHOUSE_DIR, else the cache's."""
    return base.get("CLUSTERD_WHEELHOUSE_DIR") or os.path.join(cache_root(), "wheelhouse")


def pause_image() -> str:
    return f"{IMAGE_REPO}/pause:{PAUSE_TAG}"


def node_image(key: str) -> str:
    return f"{IMAGE_REPO}/node:{key}"


def short_image(name: str) -> str:
    """The name a pod spec uses (Kubernetes adds docker.io/ back)."""
    return name.removeprefix("docker.io/")


@dataclasses.dataclass(frozen=True)
class NodeSpec:
    """A node as the bed makes it: its name, fixed index and whether it has fake GPUs."""

    name: str
    index: int
    gpus: int = 0

    @property
    def ip(self) -> str:
        return str(SUBNET.network_address + 10 + self.index)

    @property
    def pod_range(self) -> tuple[str, str]:
        """The first and last address host-local gives this node's pods."""
        base = SUBNET.network_address + 256 * self.index
        return str(base + 2), str(base + 254)

    @property
    def labels(self) -> dict[str, str]:
        out = {POOL_LABEL: "gpu" if self.gpus else "cpu", NODE_LABEL: self.name,
               "topology.kubernetes.io/zone": f"bed-zone-{'ab'[self.index % 2]}"}
        if self.gpus:
            out.update(GPU_LABELS)
        return out


def node_specs(cpu_nodes: int, gpu_nodes: int) -> list[NodeSpec]:
    return ([NodeSpec(f"cpu-{i}", i) for i in range(1, cpu_nodes + 1)]
            + [NodeSpec(f"gpu-{j}", GPU_INDEX_BASE + j, GPUS_PER_NODE)
               for j in range(1, gpu_nodes + 1)])


@dataclasses.dataclass(frozen=True)
class NodePaths:
    """One node's directories. Inside the node's mount namespace `lib`, `log` and `run` are
    /var/lib, /var/log and /run, so every path the kubelet and containerd hard-code is the
    node's own."""

    root: str

    def _p(self, *parts: str) -> str:
        return os.path.join(self.root, *parts)

    @property
    def lib(self) -> str:
        return self._p("lib")

    @property
    def log_dir(self) -> str:
        return self._p("log")

    @property
    def run(self) -> str:
        return self._p("run")

    @property
    def etc(self) -> str:  # configs, read through their bed paths
        return self._p("etc")

    @property
    def containerd_config(self) -> str:
        return self._p("etc", "containerd.toml")

    @property
    def kubelet_config(self) -> str:
        return self._p("etc", "kubelet.yaml")

    @property
    def kubeconfig(self) -> str:
        return self._p("etc", "kubelet.kubeconfig")

    @property
    def cni_dir(self) -> str:
        return self._p("etc", "cni")

    @property
    def resolv_conf(self) -> str:
        return self._p("etc", "resolv.conf")

    @property
    def cgroup_hold(self) -> str:
        return self._p("cgroup-hold")

    @property
    def node_log(self) -> str:
        return self._p("node.log")

    @property
    def containerd_log(self) -> str:
        return self._p("containerd.log")

    @property
    def kubelet_log(self) -> str:
        return self._p("kubelet.log")



@dataclasses.dataclass(frozen=True)
class BedPaths:
    dir: str

    def _p(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def state(self) -> str:
        return self._p(STATE_FILE)

    @property
    def control_sock(self) -> str:
        return self._p("control.sock")

    @property
    def logs(self) -> str:
        return self._p("logs")

    @property
    def pki(self) -> str:
        return self._p("pki")

    @property
    def kube(self) -> str:
        return self._p("kube")

    @property
    def etcd_data(self) -> str:
        return self._p("etcd")

    @property
    def flexvolume(self) -> str:
        return self._p("flexvolume")

    @property
    def client(self) -> str:
        return self._p("client")

    @property
    def kubeconfig(self) -> str:
        return self._p("kube", "kubeconfig")

    @property
    def admin_kubeconfig(self) -> str:
        return self._p("kube", "admin.kubeconfig")

    @property
    def tokens(self) -> str:
        return self._p("pki", "tokens.csv")

    def log(self, name: str) -> str:
        return self._p("logs", f"{name}.log")

    def component_kubeconfig(self, name: str) -> str:
        return self._p("kube", f"{name}.kubeconfig")

    def node(self, name: str) -> NodePaths:
        assert "/" not in name and name not in ("", ".", "..")
        return NodePaths(self._p("nodes", name))

    @property
    def nodes(self) -> str:
        return self._p("nodes")


def load_state(paths: BedPaths) -> dict[str, Any] | None:
    """The bed's state file: {"version", "dir", "netns", "cache", "package_version",
    "node_image", "procs": {component: pid}, "nodes": {name: {"index", "gpus", "pid"}},
    "wanted": {"nodes", "gpu_nodes"}}."""
    text = read_text(paths.state)
    if text is None:
        return None
    try:
        state = json.loads(text)
    except ValueError as e:
        raise Failure(f"{paths.state} is not valid JSON: {e}") from e
    if not isinstance(state, dict) or state.get("kind") != "k8s":
        raise Failure(f"{paths.state} is not a Kubernetes test bed state file")
    return state


def save_state(paths: BedPaths, state: dict[str, Any]) -> None:
    write_file(paths.state, json.dumps(state, indent=2) + "\n", 0o644)


def removed_env(name: str) -> bool:
    """Settings that could point a client at another cluster (or say it runs in one)."""
    return name.startswith(("KUBE", "KUBERNETES_")) and name != "KUBE_EDITOR"


def bed_env(paths: BedPaths, base: Mapping[str, str],
            state: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The environment of a command run in the bed: base without any Kubernetes settings,
    then KUBECONFIG (clusterd's two contexts), the admin kubeconfig, the node image's name
    (and the runtime image's), clusterd's default image (CLUSTERD_KUBERNETES_IMAGE: the
    runtime image, else the node image), the wheelhouse directory `up` fills, the bed's
    kubectl and the project's venv first on PATH, and (unless
    CLUSTERD_TESTBED_KEEP_XDG=1) XDG directories of the bed's own, so a daemon started there
    is the bed's."""
    env = {k: v for k, v in base.items() if not removed_env(k)}
    env["KUBECONFIG"] = paths.kubeconfig
    env[ADMIN_KUBECONFIG_ENV] = paths.admin_kubeconfig
    env[DIR_ENV] = paths.dir
    if state and state.get("node_image"):
        env[NODE_IMAGE_ENV] = short_image(str(state["node_image"]))
    env.pop(RUNTIME_IMAGE_ENV, None)
    if state and state.get("runtime_image"):
        env[RUNTIME_IMAGE_ENV] = short_image(str(state["runtime_image"]["name"]))
    # The images of the bed are the only ones its nodes have (they pull nothing): a daemon
    # started here uses the runtime image if there is one (no install), else the node image.
    env.pop(CLUSTERD_IMAGE_ENV, None)
    for image in (env.get(RUNTIME_IMAGE_ENV), env.get(NODE_IMAGE_ENV)):
        if image:
            env[CLUSTERD_IMAGE_ENV] = image
            break
    # the wheelhouse `up` prepared (and the runtime image holds: a daemon here then has the
    # image's KEY)
    env["CLUSTERD_WHEELHOUSE_DIR"] = wheelhouse_dir(base)
    front = [VENV_BIN]
    if state and state.get("cache"):
        front.insert(0, os.path.join(str(state["cache"]), "bin"))
    rest = [p for p in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":")
            if p and p not in front]
    env["PATH"] = ":".join([*front, *rest])
    if base.get("CLUSTERD_TESTBED_KEEP_XDG") != "1":
        env["XDG_RUNTIME_DIR"] = os.path.join(paths.client, "run")
        env["XDG_STATE_HOME"] = os.path.join(paths.client, "state")
        env["XDG_CONFIG_HOME"] = os.path.join(paths.client, "config")
    return env

# Contexts whose user has short-lived credentials from an exec plugin (exec_credential.py): a
# service account's token bound to a Secret that the controller deletes when the token is
# said to expire, so it really stops working then (401), as an EKS token does after 15 min.
# bed-x's plugin says when its tokens expire; bed-x-silent's says nothing (only a 401 tells).
EXEC_CONTEXT = "bed-x"
EXEC_SILENT_CONTEXT = "bed-x-silent"
EXEC_NAMESPACE = "bed-a"
EXEC_SERVICE_ACCOUNT = "clusterd-x"
TOKEN_TTL_ENV = "CLUSTERD_TESTBED_K8S_TOKEN_TTL"  # seconds; read by the plugin when it runs
DEFAULT_TOKEN_TTL_S = 20
# What clusterd needs, as README gives it: the bed grants bed-b's user exactly this file.
RBAC_FILE = os.path.join(REPO, "docs", "kubernetes-rbac.yaml")
RBAC_CONTEXT = "bed-b"
