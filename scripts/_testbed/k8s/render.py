"""The bed's configuration files, as text from values: kubeconfigs, the static token file,
containerd's and the kubelet's configuration, the CNI network, and the objects `up` applies
(namespaces, RBAC, the quota). Pure functions (unit-tested); the callers write the files.
Standard library only (JSON is YAML, so the YAML files that are not hand-written are JSON)."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterable, Mapping
from typing import Any

from _testbed.k8s.layout import (
    ADMIN_CONTEXT,
    ADMIN_USER,
    BED_IP,
    BRIDGE,
    CLUSTER_NAME,
    CONTEXTS,
    EXEC_NAMESPACE,
    EXEC_SERVICE_ACCOUNT,
    GPU_RESOURCE,
    KUBELET_PORT,
    QUOTA_CONTEXT,
    QUOTA_NAME,
    RBAC_CONTEXT,
    SERVICE_CIDR,
    SUBNET,
    NodeSpec,
)

APISERVER_KUBELET_CLIENT = "kube-apiserver-kubelet-client"  # the API server, to kubelets
NODE_READER_ROLE = "clusterd-testbed:node-reader"


def _q(value: str) -> str:
    """A YAML scalar, quoted as JSON (a JSON string is a YAML string)."""
    return json.dumps(value)


def kubeconfig(server: str, ca_pem: bytes, users: Mapping[str, str | dict[str, Any]],
               contexts: Iterable[tuple[str, str, str]], current: str) -> str:
    """A kubeconfig of one cluster: users {name: token, or an `exec` section}; contexts
    (name, namespace, user)."""
    ca = base64.b64encode(ca_pem).decode()
    lines = ["apiVersion: v1", "kind: Config", "preferences: {}", "clusters:",
             f"- name: {CLUSTER_NAME}", "  cluster:", f"    server: {_q(server)}",
             f"    certificate-authority-data: {ca}", "users:"]
    for name, token in users.items():
        lines += [f"- name: {_q(name)}", "  user:"]
        lines.append(f"    token: {_q(token)}" if isinstance(token, str)
                     else f"    exec: {json.dumps(token)}")
    lines.append("contexts:")
    for name, namespace, user in contexts:
        lines += [f"- name: {_q(name)}", "  context:", f"    cluster: {CLUSTER_NAME}",
                  f"    namespace: {_q(namespace)}", f"    user: {_q(user)}"]
    lines.append(f"current-context: {_q(current)}")
    return "\n".join(lines) + "\n"


def exec_plugin(python: str, plugin: str, bed_dir: str, silent: bool) -> dict[str, Any]:
    """The `exec` section of the exec contexts' users (the bed's plugin, exec_credential.py),
    in client.authentication.k8s.io/v1beta1: the bed's kubectl (1.20) knows no v1."""
    return {"apiVersion": "client.authentication.k8s.io/v1beta1", "command": python,
            "args": [plugin, "--dir", bed_dir] + (["--silent"] if silent else []),
            "installHint": "the bed's plugin: scripts/_testbed/k8s/exec_credential.py"}


def clusterd_kubeconfig(server: str, ca_pem: bytes, tokens: Mapping[str, str],
                        exec_users: Mapping[str, dict[str, Any]] | None = None) -> str:
    """The kubeconfig clusterd gets: one context per (namespace, user), bed-a current; and
    the exec contexts (bed-x, bed-x-silent) whose users' tokens come from a plugin."""
    users: dict[str, str | dict[str, Any]] = {user: tokens[user] for _, _, user in CONTEXTS}
    contexts = list(CONTEXTS)
    for context, plugin in (exec_users or {}).items():
        users[f"{context}-user"] = plugin
        contexts.append((context, EXEC_NAMESPACE, f"{context}-user"))
    return kubeconfig(server, ca_pem, users, contexts, CONTEXTS[0][0])


def admin_kubeconfig(server: str, ca_pem: bytes, token: str) -> str:
    return kubeconfig(server, ca_pem, {ADMIN_USER: token},
                      [(ADMIN_CONTEXT, "default", ADMIN_USER)], ADMIN_CONTEXT)


def token_file(entries: Iterable[tuple[str, str, list[str]]]) -> str:
    """The API server's --token-auth-file: token,user,uid,"group1,group2" lines."""
    out = []
    for token, user, groups in entries:
        line = f"{token},{user},{user}"
        if groups:
            line += ',"' + ",".join(groups) + '"'
        out.append(line)
    return "\n".join(out) + "\n"


def containerd_config(node: NodeSpec, sandbox_image: str, cni_conf_dir: str) -> str:
    """containerd's configuration for one node. Its paths are the node's mount namespace's
    (/var/lib, /run are the node's own there). restrict_oom_score_adj: runc may not lower its
    own oom_score_adj without CAP_SYS_RESOURCE (else every pod fails with "can't get final
    child's PID from pipe: EOF")."""
    return f"""# containerd of the clusterd Kubernetes test bed's node {node.name}
version = 2
root = "/var/lib/containerd"
state = "/run/containerd"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
                    "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs",
                    "io.containerd.tracing.processor.v1.otlp"]

[grpc]
  address = "/run/containerd/containerd.sock"

[plugins."io.containerd.internal.v1.opt"]
  path = "/var/lib/containerd-opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{sandbox_image}"
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  enable_selinux = false
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "{cni_conf_dir}"
    max_conf_num = 1
"""


def cni_config(node: NodeSpec) -> str:
    """The pods' network on one node: the bed's bridge (the bed gives it its addresses:
    isGateway false), each node's pods in a /24 of the bed's /16, services through the bed's
    own address on the bridge."""
    first, last = node.pod_range
    return json.dumps({
        "cniVersion": "0.4.0", "name": "clusterd-testbed",
        "plugins": [{
            "type": "bridge", "bridge": BRIDGE, "isGateway": False, "ipMasq": False,
            "hairpinMode": True,
            "ipam": {"type": "host-local",
                     "ranges": [[{"subnet": str(SUBNET), "rangeStart": first,
                                  "rangeEnd": last}]],
                     "routes": [{"dst": SERVICE_CIDR, "gw": BED_IP}]},
        }],
    }, indent=2) + "\n"


def kubelet_config(node: NodeSpec, cgroup_root: str, ca_file: str, resolv_conf: str) -> str:
    """The kubelet's KubeletConfiguration for one node (JSON). The kubelet rewrites global
    kernel settings (protectKernelDefaults: true would make it refuse to start on this
    machine instead); the bed saves and restores them."""
    return json.dumps({
        "apiVersion": "kubelet.config.k8s.io/v1beta1", "kind": "KubeletConfiguration",
        "address": node.ip, "port": KUBELET_PORT, "readOnlyPort": 0,
        "healthzBindAddress": node.ip, "healthzPort": 10248,
        "cgroupDriver": "cgroupfs", "cgroupRoot": cgroup_root, "cgroupsPerQOS": True,
        "failSwapOn": False, "makeIPTablesUtilChains": False, "protectKernelDefaults": False,
        "authentication": {"anonymous": {"enabled": False}, "webhook": {"enabled": True},
                           "x509": {"clientCAFile": ca_file}},
        "authorization": {"mode": "Webhook"},
        "clusterDomain": "cluster.local", "clusterDNS": [], "resolvConf": resolv_conf,
        "volumePluginDir": "/var/lib/kubelet/volume-plugins",
        "nodeStatusUpdateFrequency": "4s", "nodeStatusReportFrequency": "1m",
        "nodeLeaseDurationSeconds": 12,
        "imageGCHighThresholdPercent": 100, "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "50Mi", "nodefs.available": "1%",
                         "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "maxPods": 40, "serializeImagePulls": False, "rotateCertificates": False,
        "serverTLSBootstrap": False, "enforceNodeAllocatable": ["pods"],
    }, indent=2) + "\n"


def _binding(kind: str, name: str, namespace: str | None, role_kind: str, role: str,
             subject: dict[str, str]) -> dict[str, Any]:
    meta = {"name": name, **({"namespace": namespace} if namespace else {})}
    return {"apiVersion": "rbac.authorization.k8s.io/v1", "kind": kind, "metadata": meta,
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind,
                        "name": role}, "subjects": [subject]}


def _user(name: str) -> dict[str, str]:
    return {"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}


def bootstrap_objects(quota: Mapping[str, str],
                      clusterd_rbac: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """What `up` applies once the API server answers: a namespace per context, its user
    admin in it and reader of nodes, the quota of the quota context, and the API server's
    right to call kubelets (logs, exec, port-forward). With clusterd_rbac (the Role and
    ClusterRole of docs/kubernetes-rbac.yaml), the RBAC context's user gets exactly those
    instead. The exec contexts' service account is admin of its namespace and reads nodes."""
    items: list[dict[str, Any]] = []
    rbac = "rbac.authorization.k8s.io/v1"
    rbac_user = dict((c, u) for c, _, u in CONTEXTS)[RBAC_CONTEXT] if clusterd_rbac else None
    for _, namespace, user in CONTEXTS:
        items.append({"apiVersion": "v1", "kind": "Namespace",
                      "metadata": {"name": namespace}})
        if user == rbac_user:
            for role in clusterd_rbac or []:
                scoped = role["kind"] == "Role"
                meta = {**role["metadata"], **({"namespace": namespace} if scoped else {})}
                items.append({**role, "metadata": meta})
                items.append(_binding("RoleBinding" if scoped else "ClusterRoleBinding",
                                      f"{user}-{meta['name']}", namespace if scoped else None,
                                      role["kind"], meta["name"], _user(user)))
            continue
        items.append(_binding("RoleBinding", f"{user}-admin", namespace, "ClusterRole",
                              "admin", _user(user)))
    account = {"kind": "ServiceAccount", "name": EXEC_SERVICE_ACCOUNT,
               "namespace": EXEC_NAMESPACE}
    items.append({"apiVersion": "v1", "kind": "ServiceAccount",
                  "metadata": {"name": EXEC_SERVICE_ACCOUNT, "namespace": EXEC_NAMESPACE}})
    items.append(_binding("RoleBinding", f"{EXEC_SERVICE_ACCOUNT}-admin", EXEC_NAMESPACE,
                          "ClusterRole", "admin", account))
    items.append(_binding("ClusterRoleBinding", f"{EXEC_SERVICE_ACCOUNT}-node-reader", None,
                          "ClusterRole", NODE_READER_ROLE, account))
    items.append({"apiVersion": rbac, "kind": "ClusterRole",
                  "metadata": {"name": NODE_READER_ROLE},
                  "rules": [{"apiGroups": [""], "resources": ["nodes"],
                             "verbs": ["get", "list", "watch"]}]})
    items.append({"apiVersion": rbac, "kind": "ClusterRoleBinding",
                  "metadata": {"name": NODE_READER_ROLE},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": NODE_READER_ROLE},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                "name": user} for _, _, user in CONTEXTS
                               if user != rbac_user]})
    items.append({"apiVersion": rbac, "kind": "ClusterRoleBinding",
                  "metadata": {"name": "clusterd-testbed:apiserver-kubelet-client"},
                  "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                              "name": "system:kubelet-api-admin"},
                  "subjects": [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User",
                                "name": APISERVER_KUBELET_CLIENT}]})
    namespace = dict((c, n) for c, n, _ in CONTEXTS)[QUOTA_CONTEXT]
    items.append({"apiVersion": "v1", "kind": "ResourceQuota",
                  "metadata": {"name": QUOTA_NAME, "namespace": namespace},
                  "spec": {"hard": dict(quota)}})
    return {"apiVersion": "v1", "kind": "List", "items": items}


def gpu_capacity_patch(gpus: int) -> str:
    """A JSON patch for a node's status: `gpus` of GPU_RESOURCE in capacity and allocatable
    (how an extended resource is advertised without a device plugin)."""
    key = GPU_RESOURCE.replace("~", "~0").replace("/", "~1")
    return json.dumps([{"op": "add", "path": f"/status/{part}/{key}", "value": str(gpus)}
                       for part in ("capacity", "allocatable")])
