"""The aws provider's handle of a cluster: where it lives, what it was made with, and its
instances as last seen (the head first)."""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.providers.base import Placement, ProviderHandle


@dataclasses.dataclass(frozen=True)
class AWSNode:
    """An instance as the handle records it."""

    id: str
    role: str = "worker"  # head or worker (its clusterd-node-role tag)
    ip: str = ""  # private
    public_ip: str | None = None
    state: str = "running"  # EC2's name for it
    reason: str = ""  # EC2's state reason, when it is not running
    launched: str = ""  # its launch time, as EC2 gave it
    image: str = ""  # the AMI it was launched from ("": a record from before it was kept)

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if not out["image"]:  # a record from before it was kept reads back as it was
            del out["image"]
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AWSNode:
        return cls(str(data["id"]), data.get("role", "worker"), data.get("ip", ""),
                   data.get("public_ip"), data.get("state", "running"),
                   data.get("reason", ""), data.get("launched", ""), data.get("image", ""))


@dataclasses.dataclass(frozen=True)
class AWSHandle(ProviderHandle, provider="aws"):
    region: str  # "" where not known (a launch that never chose one)
    zone: str = ""
    instance_type: str | None = None
    spot: bool = False
    vpc: str = ""
    subnet: str = ""
    security_group: str = ""  # the cluster's own
    key_name: str = ""  # the daemon's key pair, as imported in the region
    ssh_user: str = ""  # "": the configured one
    use_internal_ips: bool = True
    cpus: float = 0  # per node, as placed
    gpus: float = 0  # per node (accelerators that are not GPUs count none)
    nodes: tuple[AWSNode, ...] = ()  # the head first, then workers by launch time

    def to_json(self) -> dict[str, Any]:
        return {**{f.name: getattr(self, f.name) for f in dataclasses.fields(self)},
                "nodes": [n.to_json() for n in self.nodes]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> AWSHandle:
        return cls(
            region=data.get("region") or "", zone=data.get("zone") or "",
            instance_type=data.get("instance_type"), spot=bool(data.get("spot", False)),
            vpc=data.get("vpc", ""), subnet=data.get("subnet", ""),
            security_group=data.get("security_group", ""), key_name=data.get("key_name", ""),
            ssh_user=data.get("ssh_user", ""),
            use_internal_ips=bool(data.get("use_internal_ips", True)),
            cpus=data.get("cpus", 0), gpus=data.get("gpus", 0),
            nodes=tuple(AWSNode.from_json(n) for n in data.get("nodes", [])),
        )

    @classmethod
    def for_intent(cls, intent: Placement | None) -> AWSHandle:
        """Where a launch was creating the cluster, with no instances recorded."""
        if intent is None:
            return cls("")
        return cls(intent.region or "", intent.zone or "", intent.instance_type, intent.spot,
                   cpus=intent.cpus)

    @property
    def instance_ids(self) -> list[str]:
        return [n.id for n in self.nodes]
