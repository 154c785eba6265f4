"""The EC2 test bed's address rule (scripts/_testbed/ec2/addresses.py), on an in-process moto:
a terminated instance's address goes to no new instance while a node still answers on it,
and is handed out again once that node is gone."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

# moto and boto3 are dev dependencies (pyproject.toml): missing, the test fails, never skips.
import boto3
import moto
from _testbed.ec2 import addresses


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")):  # seconds saved: no AMI needed
        monkeypatch.setenv(key, value)
    with moto.mock_aws():
        yield boto3.client("ec2", region_name="us-east-1")


def launch(ec2: Any, subnet: str) -> tuple[str, str]:
    # As clusterd asks: the interface goes with the instance (and so its address).
    (inst,) = ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1, NetworkInterfaces=[
        {"DeviceIndex": 0, "SubnetId": subnet, "DeleteOnTermination": True}])["Instances"]
    return inst["InstanceId"], inst["PrivateIpAddress"]


def test_an_address_a_node_still_answers_on_goes_to_no_new_instance(ec2: Any) -> None:
    held: set[str] = set()
    addresses.install(lambda: frozenset(held))
    try:
        vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
        subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
        first, address = launch(ec2, subnet)
        ec2.terminate_instances(InstanceIds=[first])
        held.add(address)  # its node is still up
        _, second = launch(ec2, subnet)
        assert second != address
        held.discard(address)  # its node is gone: the address is free again
        _, third = launch(ec2, subnet)
        assert third == address
    finally:
        addresses.uninstall()


def test_without_the_rule_moto_hands_the_address_out_at_once(ec2: Any) -> None:
    """What the rule is for: moto alone reuses a terminated instance's address first."""
    vpc = ec2.create_vpc(CidrBlock="10.9.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.9.1.0/24")["Subnet"]["SubnetId"]
    first, address = launch(ec2, subnet)
    ec2.terminate_instances(InstanceIds=[first])
    assert launch(ec2, subnet)[1] == address
