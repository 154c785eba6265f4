"""The objects a cluster is made of on Kubernetes, as the API takes them: a pod per node (the
head, then workers), a NodePort Service per pod for SSH (`networking_mode: nodeport`), and one
for the head's task ports. Names are fixed by the cluster's cloud name, so a create retried
(or resumed after a crash) finds what is there (409) instead of making it twice; labels name
the cluster, the role and this daemon, so one list per context finds every pod of ours.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd import pod_config
from clusterd.providers.kubernetes.capacity import GPU_RESOURCE
from clusterd.providers.kubernetes.gpu_labels import GPU_TOLERATION, GpuSelector
from clusterd.providers.kubernetes.start_script import SSH_USER_ENV, command

LABEL_CLOUD_NAME = "clusterd-cluster-name"
LABEL_CLUSTER = "clusterd-cluster"
LABEL_ROLE = "clusterd-node-role"
LABEL_MANAGED_BY = "clusterd-managed-by"
LABEL_POD = "clusterd-pod"  # a pod's own name: what its SSH Service selects
# The create token of the launch attempt that made the object (ClusterRequest.create_token).
# Anyone who can list pods reads it, so it proves only "made by the create that knew it first".
ANNOTATION_CREATE_TOKEN = "clusterd-create-token"
PUBLIC_KEY_ENV = "CLUSTERD_SSH_PUBLIC_KEY"
SSH_PORT = 22
# Ray keeps its objects in /dev/shm, which a container gets 64 MB of: a memory-backed
# volume instead, as SkyPilot mounts one.
SHM_VOLUME = "dshm"


def pod_name(cloud_name: str, index: int) -> str:
    return f"{cloud_name}-head" if index == 0 else f"{cloud_name}-worker{index}"


def ssh_service_name(pod: str) -> str:
    return f"{pod}-ssh"


def ports_service_name(cloud_name: str) -> str:
    return f"{cloud_name}-ports"


@dataclasses.dataclass(frozen=True)
class PodSpec:
    """What every pod of a cluster gets."""

    cloud_name: str
    cluster: str
    managed_by: str
    image: str
    pull_policy: str
    public_key: str
    cpus: float
    memory_gb: float
    gpus: float = 0
    accelerator: str | None = None
    labels: tuple[tuple[str, str], ...] = ()
    create_token: str = ""
    # The nodes with the GPU model asked for, by the labels they carry (gpu_labels).
    gpu_selector: GpuSelector | None = None
    # Local disk asked for (the runtime and the workdir live in the container's own
    # filesystem): a Kubernetes quantity, "" for none.
    ephemeral_storage: str = ""
    ephemeral_storage_limit: str = ""
    # pod_config fragments (canonical JSON), merged in this order: the config file's, the
    # task's.
    pod_configs: tuple[str, ...] = ()
    ssh_user: str = "sky"  # the login user the start script makes (if missing)

    def selector(self) -> dict[str, str]:
        return {LABEL_CLOUD_NAME: self.cloud_name, LABEL_MANAGED_BY: self.managed_by}

    def metadata(self, name: str, labels: dict[str, str]) -> dict[str, Any]:
        return {"name": name, "labels": labels,
                "annotations": {ANNOTATION_CREATE_TOKEN: self.create_token}}


def _quantity(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


def pod_manifest(spec: PodSpec, index: int) -> dict[str, Any]:
    name = pod_name(spec.cloud_name, index)
    requests = {"cpu": _quantity(spec.cpus), "memory": f"{_quantity(spec.memory_gb)}Gi"}
    limits = {"memory": requests["memory"]}
    if spec.gpus:
        requests[GPU_RESOURCE] = limits[GPU_RESOURCE] = _quantity(spec.gpus)
    if spec.ephemeral_storage:
        requests["ephemeral-storage"] = spec.ephemeral_storage
    if spec.ephemeral_storage_limit:
        limits["ephemeral-storage"] = spec.ephemeral_storage_limit
    labels = {**dict(spec.labels), **spec.selector(), LABEL_CLUSTER: spec.cluster,
              LABEL_ROLE: "head" if index == 0 else "worker", LABEL_POD: name}
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": spec.metadata(name, labels),
        "spec": {
            # A pod that ended is a node lost: the daemon notices and says so; it must not
            # come back by itself with its disk wiped.
            "restartPolicy": "Never",
            "terminationGracePeriodSeconds": 5,
            "hostname": name,
            # Nothing in a pod talks to the API server: no token to steal there.
            "automountServiceAccountToken": False,
            "enableServiceLinks": False,
            "containers": [{
                "name": "node",
                "image": spec.image,
                "imagePullPolicy": spec.pull_policy,
                # clusterd's start script, not the image's entrypoint: any image with a
                # shell works (it installs sshd, rsync and sudo where they are missing).
                "command": command(),
                "env": [{"name": PUBLIC_KEY_ENV, "value": spec.public_key},
                        {"name": SSH_USER_ENV, "value": spec.ssh_user}],
                # Why the start script gave up, in the pod's status when it does.
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "ports": [{"name": "ssh", "containerPort": SSH_PORT}],
                "resources": {"requests": requests, "limits": limits},
                # Running is not ready: sshd answers a moment after the container starts.
                "readinessProbe": {"tcpSocket": {"port": SSH_PORT}, "periodSeconds": 1,
                                   "failureThreshold": 600},
                "volumeMounts": [{"name": SHM_VOLUME, "mountPath": "/dev/shm"}],
            }],
            "volumes": [{"name": SHM_VOLUME, "emptyDir": {"medium": "Memory"}}],
        },
    }
    # The cluster's pods on distinct nodes where there are enough: a node lost takes one.
    pod["spec"]["affinity"] = {"podAntiAffinity": {
        "preferredDuringSchedulingIgnoredDuringExecution": [{
            "weight": 100,
            "podAffinityTerm": {"labelSelector": {"matchLabels": spec.selector()},
                                "topologyKey": "kubernetes.io/hostname"}}]}}
    if spec.gpu_selector is not None and spec.gpu_selector.terms:
        pod["spec"]["affinity"]["nodeAffinity"] = spec.gpu_selector.node_affinity()
    if spec.gpus:
        # GPU node pools are commonly tainted so that only pods asking for GPUs land there.
        pod["spec"]["tolerations"] = [dict(GPU_TOLERATION)]
    for fragment in spec.pod_configs:
        pod = pod_config.merge(pod, fragment)
    return pod


def ssh_service_manifest(spec: PodSpec, pod: str) -> dict[str, Any]:
    """A NodePort Service reaching one pod's sshd (`networking_mode: nodeport`)."""
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": spec.metadata(ssh_service_name(pod),
                                  {**spec.selector(), LABEL_CLUSTER: spec.cluster}),
        "spec": {"type": "NodePort", "selector": {LABEL_POD: pod},
                 "ports": [{"name": "ssh", "port": SSH_PORT, "targetPort": SSH_PORT}]},
    }


def ports_service_manifest(spec: PodSpec, ports: list[tuple[int, int]]) -> dict[str, Any]:
    """A NodePort Service for the head's task ports (a range becomes one port each)."""
    numbers = sorted({p for first, last in ports for p in range(first, last + 1)})
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": spec.metadata(ports_service_name(spec.cloud_name),
                                  {**spec.selector(), LABEL_CLUSTER: spec.cluster}),
        "spec": {"type": "NodePort",
                 "selector": {**spec.selector(), LABEL_ROLE: "head"},
                 "ports": [{"name": f"p{p}", "port": p, "targetPort": p} for p in numbers]},
    }
