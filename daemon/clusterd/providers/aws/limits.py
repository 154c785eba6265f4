"""What EC2 accepts, known by name before any call: an instance family's CPU architecture,
an EBS volume's IOPS and throughput for its size, and how long a node's name may be.

Each is checked here so that a launch that EC2 would refuse is refused first, saying why and
what to ask for instead, or adjusted where nothing the user asked for changes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import re
from typing import Any

# Graviton families carry a "g" among the letters after the generation number (c7g, m7gd,
# c7gn, r8g, x2gd, t4g, g5g, im4gn, is4gen, hpc7g, i8g), and the first, a1, none. GPU
# families that are not Graviton (g4dn, g5, gr6, p5) have no "g" after their number.
_GRAVITON_FAMILY = re.compile(r"^(a1|[a-z]+\d+[a-z]*g[a-z]*)(-flex)?$")

# A label of a DNS name (a hostname, a Kubernetes object's name): what a node's name must fit.
MAX_NODE_NAME = 63


def instance_arch(instance_type: str) -> str:
    """The CPU architecture of an instance type by its family, as Ubuntu's image names it:
    "arm64" for Graviton, else "amd64"."""
    family = instance_type.split(".", 1)[0].lower()
    return "arm64" if _GRAVITON_FAMILY.match(family) else "amd64"


def node_name(cloud_name: str, role: str) -> str:
    """An instance's Name tag: `{cloud_name}-{role}`, within 63 characters. Where that is
    longer, the cluster's part is cut and a hash of the whole name keeps it unique (the cut
    would drop the launch's random suffix, at the end)."""
    whole = f"{cloud_name}-{role}"
    if len(whole) <= MAX_NODE_NAME:
        return whole
    digest = hashlib.sha256(cloud_name.encode()).hexdigest()[:6]
    keep = MAX_NODE_NAME - len(role) - len(digest) - 2
    return f"{cloud_name[:keep].rstrip('-')}-{digest}-{role}"


@dataclasses.dataclass(frozen=True)
class VolumeSpec:
    """One of SkyPilot's disk tiers on AWS as an EBS volume."""

    volume_type: str
    iops: int | None = None
    throughput: int | None = None  # MiB/s

    def min_size_gb(self) -> int:
        """The smallest volume EC2 gives this type with these IOPS: gp3 allows at most 500
        IOPS per GiB, io2 (Block Express) 1000, and io2 is at least 4 GiB."""
        if self.volume_type == "gp3" and self.iops:
            return -(-self.iops // 500)
        if self.volume_type == "io2":
            return max(4, -(-(self.iops or 0) // 1000))
        return 1

    def mapping(self) -> dict[str, Any]:
        out: dict[str, Any] = {"VolumeType": self.volume_type}
        if self.iops is not None:
            out["Iops"] = self.iops
        if self.throughput is not None:
            out["Throughput"] = self.throughput
        return out


def volume_for(tier: str | None) -> VolumeSpec:
    """SkyPilot's disk tiers on AWS (medium when none is asked): the EBS volume type, and
    its IOPS and throughput (MiB/s) where the type takes them (gp3: throughput at most a
    quarter of the IOPS)."""
    tier = {"best": "ultra", None: "medium"}.get(tier, tier)
    if tier == "low":
        return VolumeSpec("standard")
    if tier == "ultra":
        return VolumeSpec("io2", 20_000)
    iops = 7_000 if tier == "high" else 3_500
    return VolumeSpec("gp3", iops, iops // 16)


def check_volume(tier: str | None, size_gb: int) -> str | None:
    """Why EC2 would refuse a root volume of `size_gb` for `tier`, or None if it would not."""
    spec = volume_for(tier)
    least = spec.min_size_gb()
    if size_gb < least:
        return (f"disk_tier {tier or 'medium'} is an EBS {spec.volume_type} volume with "
                f"{spec.iops} IOPS, which EC2 gives only to volumes of at least {least} GB; "
                f"disk_size is {size_gb} GB")
    return None


def ebs_volume(tier: str | None) -> dict[str, Any]:
    """The block device mapping's Ebs fields of a tier (VolumeType, Iops, Throughput)."""
    return volume_for(tier).mapping()
