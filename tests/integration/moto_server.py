"""moto's server as its own process on 127.0.0.1 (a real HTTP endpoint for EC2, STS, S3),
for the integration modules that run in a network namespace with only `lo`."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import boto3
import pytest

from tests.support import wait_for

IN_NETNS = "CLUSTERD_TEST_IN_NETNS"
IAM_AUTH = Path(__file__).resolve().parents[2] / "scripts/_testbed/ec2/iam_auth.py"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server(scratch: Path, env: dict[str, str] | None = None,
                iam_faithful: bool = False) -> Iterator[str]:
    """Start moto_server, wait until it answers, yield its URL; stop it by its PID.
    `iam_faithful`: with IAM's resource ARNs for role and profile calls (the bed's
    iam_auth.py), for tests that turn moto's IAM enforcement on."""
    interfaces = sorted(name for _, name in socket.if_nameindex())
    assert interfaces == ["lo"], f"not in a namespace with only lo: {interfaces}"
    port = free_port()
    with open(scratch / "moto.log", "wb") as out:
        program = ([sys.executable, str(IAM_AUTH)] if iam_faithful
                   else [str(Path(sys.executable).with_name("moto_server"))])
        server = subprocess.Popen(
            [*program, "-H", "127.0.0.1", "-p", str(port)], stdout=out, stderr=out,
            start_new_session=True, env={**os.environ, **(env or {})})

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        wait_for(answers, 30, "moto_server")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)


def aws_environment(directory: Path, endpoint: str, services: tuple[str, ...],
                    monkeypatch: pytest.MonkeyPatch,
                    keys: tuple[str, str] = ("testing", "testing")) -> Path:
    """This process's AWS settings, and nothing else's: a throw-away credentials file (of
    `keys`) and config in `directory`, `services` pointed at `endpoint`, instance metadata
    never asked."""
    credentials = directory / "credentials"
    credentials.write_text(f"[default]\naws_access_key_id = {keys[0]}\n"
                           f"aws_secret_access_key = {keys[1]}\n")
    config = directory / "config"
    config.write_text("[default]\nregion = us-east-1\n")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for service in services:
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service.upper()}", endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return directory


def ubuntu_image(scratch: Path, image: str) -> dict[str, str]:
    """moto's documented way to preload images: Ubuntu 22.04 under Canonical's owner id, as
    `image`. Returns the environment moto_server needs for it."""
    (scratch / "amis.json").write_text(json.dumps([{
        "ami_id": image, "state": "available", "public": True,
        "owner_id": "099720109477", "root_device_type": "ebs", "root_device_name": "/dev/sda1",
        "description": "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image",
        "image_type": "machine", "architecture": "x86_64", "virtualization_type": "hvm",
        "name": "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20240927",
        "hypervisor": "xen", "creation_date": "2024-09-27T00:00:00.000Z",
    }]))
    return {"MOTO_AMIS_PATH": str(scratch / "amis.json")}


def make_loopback_vpc(endpoint: str, region: str, number: int) -> None:
    """As the EC2 test bed does: no default VPC, one 127.R.0.0/16 VPC, a subnet per zone (the
    first zone's routing to an internet gateway)."""
    client: Any = boto3.client("ec2", region_name=region, endpoint_url=endpoint,
                               aws_access_key_id="testing", aws_secret_access_key="testing")
    for vpc in client.describe_vpcs()["Vpcs"]:
        for subnet in client.describe_subnets(
                Filters=[{"Name": "vpc-id", "Values": [vpc["VpcId"]]}])["Subnets"]:
            client.delete_subnet(SubnetId=subnet["SubnetId"])
        client.delete_vpc(VpcId=vpc["VpcId"])
    vpc = client.create_vpc(CidrBlock=f"127.{number}.0.0/16", TagSpecifications=[
        {"ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": "loopback"}]}])["Vpc"]
    zones = client.describe_availability_zones()["AvailabilityZones"]
    subnets = [client.create_subnet(VpcId=vpc["VpcId"], CidrBlock=f"127.{number}.{index}.0/24",
                                    AvailabilityZone=zone)["Subnet"]["SubnetId"]
               for index, zone in enumerate(sorted(z["ZoneName"] for z in zones), start=1)]
    # As a user's own VPC often is: the first zone's subnet public (a route table of its own
    # sending 0.0.0.0/0 to an internet gateway), the others private (the main table's routes).
    igw = client.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    client.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc["VpcId"])
    table = client.create_route_table(VpcId=vpc["VpcId"])["RouteTable"]["RouteTableId"]
    client.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    client.associate_route_table(RouteTableId=table, SubnetId=subnets[0])
