"""What EC2 accepts, by name (providers/aws/limits.py): Graviton families, node names within
63 characters, and disk tiers whose IOPS need a bigger volume."""

from __future__ import annotations

import pytest

from clusterd.providers.aws.limits import (
    MAX_NODE_NAME,
    check_volume,
    instance_arch,
    node_name,
    volume_for,
)

GRAVITON = ("a1.large", "t4g.micro", "m6g.large", "m6gd.xlarge", "m7g.large", "m7gd.2xlarge",
            "m8g.large", "c6g.large", "c6gn.16xlarge", "c7g.large", "c7gd.large",
            "c7gn.large", "c8g.large", "r6g.large", "r7g.large", "r8g.large", "x2gd.large",
            "x8g.large", "im4gn.large", "is4gen.large", "i4g.large", "i8g.large",
            "hpc7g.16xlarge", "g5g.xlarge")
X86 = ("t3.micro", "t2.micro", "m5.large", "m6i.large", "m7i-flex.large", "c6i.large",
       "c7a.large", "r6a.large", "x2iedn.xlarge", "x2idn.16xlarge", "g4dn.xlarge",
       "g4ad.xlarge", "g5.xlarge", "g6e.xlarge", "gr6.4xlarge", "p3.2xlarge", "p4d.24xlarge",
       "p5.48xlarge", "inf2.xlarge", "trn1.2xlarge", "dl1.24xlarge", "z1d.large",
       "i3en.large", "hpc6a.48xlarge", "m5zn.large", "u-6tb1.56xlarge", "vt1.3xlarge")


@pytest.mark.parametrize("instance_type", GRAVITON)
def test_graviton_families_are_arm64(instance_type: str) -> None:
    assert instance_arch(instance_type) == "arm64"


@pytest.mark.parametrize("instance_type", X86)
def test_other_families_are_amd64(instance_type: str) -> None:
    assert instance_arch(instance_type) == "amd64"


def test_a_short_node_name_is_the_cluster_and_role() -> None:
    assert node_name("duo-ab12cd", "worker") == "duo-ab12cd-worker"


def test_a_long_node_name_is_cut_to_63_keeping_it_unique() -> None:
    base = "a" * 50  # the longest cluster part cloud_name_for makes, then "-" + 6 hex
    one, other = f"{base}-aaaaaa", f"{base}-bbbbbb"
    assert len(f"{one}-worker") == 64
    names = {node_name(one, "worker"), node_name(other, "worker"), node_name(one, "head")}
    assert len(names) == 3
    for name in names:
        assert len(name) <= MAX_NODE_NAME and name.startswith("aaaa")
        assert name.endswith(("-worker", "-head"))


@pytest.mark.parametrize(("tier", "size", "least"), [
    ("high", 13, 14),     # gp3: 7000 IOPS need 14 GiB (500 IOPS per GiB)
    ("medium", 6, 7),     # gp3: 3500 IOPS need 7 GiB
    (None, 6, 7),
    ("ultra", 19, 20),    # io2: 20000 IOPS need 20 GiB (1000 IOPS per GiB)
    ("best", 19, 20),
])
def test_a_tier_whose_iops_need_a_bigger_volume_is_refused_saying_so(
        tier: str | None, size: int, least: int) -> None:
    why = check_volume(tier, size)
    assert why is not None
    assert f"at least {least} GB" in why and f"disk_size is {size} GB" in why
    assert check_volume(tier, least) is None


def test_low_takes_any_size_and_gp3_throughput_fits_its_iops() -> None:
    assert check_volume("low", 1) is None
    for tier in ("medium", "high"):
        spec = volume_for(tier)
        assert spec.throughput is not None and spec.iops is not None
        assert spec.throughput <= spec.iops / 4 and spec.throughput <= 1000
