"""What the daemon keeps of a Kubernetes cluster: where it is (context, namespace), how its pods
are reached, what each pod asked for, and the pods themselves (head first) with the addresses
they were given. A pod keeps its address for life: a pod that is gone is a node lost."""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.providers.base import ProviderHandle


@dataclasses.dataclass(frozen=True)
class KubernetesPod:
    name: str
    ip: str = ""  # the pod's own address (Ray's node address)
    node: str = ""  # the Kubernetes node it runs on
    host_ip: str = ""  # that node's address (NodePort SSH goes there)
    ssh_node_port: int = 0  # networking_mode nodeport: its SSH Service's node port
    # The pod's identity: a pod made again under its name is another machine (its host key
    # is pinned afresh).
    uid: str = ""

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KubernetesPod:
        return cls(str(data["name"]), str(data.get("ip") or ""), str(data.get("node") or ""),
                   str(data.get("host_ip") or ""), int(data.get("ssh_node_port") or 0),
                   str(data.get("uid") or ""))


@dataclasses.dataclass(frozen=True)
class KubernetesHandle(ProviderHandle, provider="kubernetes"):
    context: str  # "" where not known (a launch that never chose one)
    namespace: str = ""
    networking: str = "portforward"  # or "nodeport"
    ssh_user: str = ""
    cpus: float = 0  # per pod, as asked
    memory_gb: float = 0
    gpus: float = 0
    accelerator: str | None = None
    pods: tuple[KubernetesPod, ...] = ()  # the head first

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "pods": [p.to_json() for p in self.pods]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> KubernetesHandle:
        return cls(
            context=str(data.get("context") or ""), namespace=str(data.get("namespace") or ""),
            networking=str(data.get("networking") or "portforward"),
            ssh_user=str(data.get("ssh_user") or ""), cpus=float(data.get("cpus") or 0),
            memory_gb=float(data.get("memory_gb") or 0), gpus=float(data.get("gpus") or 0),
            accelerator=data.get("accelerator"),
            pods=tuple(KubernetesPod.from_json(p) for p in data.get("pods") or []))
