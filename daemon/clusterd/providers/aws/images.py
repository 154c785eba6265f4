"""The image an instance boots when the task names none: found by name in each region, as
SkyPilot finds its defaults, since image ids differ per region and change with every release.

- CPU instance types: Canonical's Ubuntu 22.04 (SkyPilot's default image too).
- NVIDIA GPU types (G and P families): AWS's Deep Learning Base OSS Nvidia Driver GPU AMI for
  Ubuntu 22.04, which has the driver and CUDA (plain Ubuntu has no driver: a GPU job there
  cannot see its GPUs).
- Trainium and Inferentia types: AWS's Deep Learning AMI Neuron for Ubuntu 22.04 (the Neuron
  driver and SDK).

`resources.image_id` overrides all of them. The newest image of the name wins (its creation
date, then its name, whose tail is the build date).
"""

from __future__ import annotations

import dataclasses
import enum

CANONICAL_OWNER = "099720109477"
AMAZON_OWNER = "amazon"  # the alias DescribeImages takes for AWS's own images (the DLAMIs)


class ImageKind(enum.Enum):
    UBUNTU = "ubuntu"
    NVIDIA = "nvidia"
    NEURON = "neuron"


@dataclasses.dataclass(frozen=True)
class ImageName:
    """Where to find a kind of image: its publisher and its name pattern by architecture."""

    what: str  # for messages
    owner: str
    patterns: dict[str, str]  # arch (amd64, arm64) -> DescribeImages name filter

    def pattern(self, arch: str) -> str | None:
        return self.patterns.get(arch)


IMAGE_NAMES = {
    ImageKind.UBUNTU: ImageName("Ubuntu 22.04 from Canonical", CANONICAL_OWNER, {
        arch: f"ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-{arch}-server-*"
        for arch in ("amd64", "arm64")}),
    ImageKind.NVIDIA: ImageName("AWS's Deep Learning Base GPU AMI (Ubuntu 22.04)", AMAZON_OWNER, {
        "amd64": "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *",
        "arm64": "Deep Learning ARM64 Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *"}),
    ImageKind.NEURON: ImageName("AWS's Deep Learning AMI Neuron (Ubuntu 22.04)", AMAZON_OWNER, {
        "amd64": "Deep Learning AMI Neuron (Ubuntu 22.04) *"}),
}
# Accelerators by the catalog's names (SkyPilot's): these are Neuron devices, not GPUs.
NEURON_ACCELERATORS = ("inferentia", "trainium")


def default_image_kind(accelerator: str | None) -> ImageKind:
    """The kind of image an instance type with `accelerator` (the catalog's AcceleratorName,
    None for none) boots by default."""
    if not accelerator:
        return ImageKind.UBUNTU
    if accelerator.lower().startswith(NEURON_ACCELERATORS):
        return ImageKind.NEURON
    return ImageKind.NVIDIA
