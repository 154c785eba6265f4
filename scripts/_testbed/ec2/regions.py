"""The bed's regions: a fixed loopback /16 per region, a /24 subnet per zone (the first one
routing to an internet gateway, the others private), no default VPC, the public images clusterd
looks up by name (IMAGES), and the bed's runtime images. The table and address helpers are
standard library only; `setup_region` is handed a boto3 EC2 client (to moto itself) and moto's
backend by the controller, `register_runtime_image` moto's backend."""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import logging
from typing import Any

from _testbed.common import assert_loopback
from _testbed.ec2.layout import ACCOUNT_ID, VPC_NAME, runtime_image_name

log = logging.getLogger("testbed.ec2.regions")

# region -> R in 127.R.0.0/16
REGION_NUMBERS = {
    "us-east-1": 1, "us-east-2": 2, "us-west-1": 3, "us-west-2": 4, "ca-central-1": 5,
    "eu-west-1": 6, "eu-west-2": 7, "eu-west-3": 8, "eu-central-1": 9, "eu-north-1": 10,
    "ap-south-1": 11, "ap-northeast-1": 12, "ap-northeast-2": 13, "ap-northeast-3": 14,
    "ap-southeast-1": 15, "ap-southeast-2": 16, "sa-east-1": 17,
}
CANONICAL_OWNER = "099720109477"
AMAZON_OWNER = "898082745236"  # the account that publishes the Deep Learning AMIs (alias amazon)
IMAGE_DATE = datetime.datetime(2024, 9, 27, 12, 0, tzinfo=datetime.UTC)
DLAMI_DATE = datetime.datetime(2024, 11, 15, 12, 0, tzinfo=datetime.UTC)


@dataclasses.dataclass(frozen=True)
class PublicImage:
    """An image the bed registers in every region under its real publisher's name, and the
    root its instances boot in (`root`: a Debian root of images.py standing in for it, or
    "host" for the machine's own; `driver`: the stand-in driver programs it has, drivers.py)."""

    name: str
    owner: str
    architecture: str
    description: str
    created: datetime.datetime
    root: str = "host"
    driver: str | None = None
    alias: str | None = None


# As their publishers name them. Ubuntu 22.04 is Python 3.10 without the venv module: the
# bullseye root (3.9, no venv) stands in; 24.04 (3.12) the trixie root (3.13).
IMAGES = (
    PublicImage("ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-20240927",
                CANONICAL_OWNER, "x86_64", "Canonical, Ubuntu, 22.04 LTS, amd64 jammy image "
                "build on 2024-09-27", IMAGE_DATE, root="bullseye"),
    PublicImage("ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-arm64-server-20240927",
                CANONICAL_OWNER, "arm64", "Canonical, Ubuntu, 22.04 LTS, arm64 jammy image "
                "build on 2024-09-27", IMAGE_DATE, root="bullseye"),
    PublicImage("ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-20240927",
                CANONICAL_OWNER, "x86_64", "Canonical, Ubuntu, 24.04 LTS, amd64 noble image "
                "build on 2024-09-27", IMAGE_DATE, root="trixie"),
    PublicImage("Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) 20241115",
                AMAZON_OWNER, "x86_64", "Supported EC2 instances: G4dn, G5, G6, Gr6, G6e, "
                "P4d, P4de, P5, P5e. NVIDIA driver and CUDA (the bed: a stand-in driver)",
                DLAMI_DATE, driver="nvidia", alias="amazon"),
    PublicImage("Deep Learning AMI Neuron (Ubuntu 22.04) 20241115", AMAZON_OWNER, "x86_64",
                "Supported EC2 instances: Inf1, Inf2, Trn1, Trn1n, Trn2. Neuron SDK (the bed: "
                "a stand-in driver)", DLAMI_DATE, driver="neuron", alias="amazon"),
    PublicImage("clusterd-testbed/host-root-amd64-20240927", CANONICAL_OWNER, "x86_64",
                "clusterd test bed: the machine's own root, as every node ran before the bed "
                "had images", IMAGE_DATE),
)
HOST_IMAGE = IMAGES[-1].name


def image_by_name(name: str | None) -> PublicImage | None:
    return next((i for i in IMAGES if i.name == name), None)


def check_regions(regions: list[str]) -> list[str]:
    """The regions, deduplicated in order; ValueError names one the bed does not know."""
    out: list[str] = []
    for r in regions:
        if r not in REGION_NUMBERS:
            raise ValueError(f"region {r!r} is not one the test bed knows "
                             f"({', '.join(REGION_NUMBERS)})")
        if r not in out:
            out.append(r)
    if not out:
        raise ValueError("no regions given")
    return out


def vpc_cidr(region: str) -> str:
    return f"127.{REGION_NUMBERS[region]}.0.0/16"


def subnet_cidr(region: str, zone: str) -> str:
    """127.R.Z.0/24: Z is 1 for zone letter a, 2 for b, ..."""
    letter = zone[len(region):]
    assert zone.startswith(region) and len(letter) == 1 and letter.isalpha(), zone
    cidr = f"127.{REGION_NUMBERS[region]}.{ord(letter) - ord('a') + 1}.0/24"
    assert ipaddress.IPv4Network(cidr).subnet_of(ipaddress.IPv4Network(vpc_cidr(region)))
    return cidr


def _delete_default_vpcs(ec2: Any) -> None:
    """moto makes a default VPC (172.31.0.0/16) in every region: delete it and what blocks that."""
    vpcs = ec2.describe_vpcs(Filters=[{"Name": "is-default", "Values": ["true"]}])["Vpcs"]
    for vpc in vpcs:
        vid = vpc["VpcId"]
        by_vpc = [{"Name": "vpc-id", "Values": [vid]}]
        for sn in ec2.describe_subnets(Filters=by_vpc)["Subnets"]:
            ec2.delete_subnet(SubnetId=sn["SubnetId"])
        igws = ec2.describe_internet_gateways(
            Filters=[{"Name": "attachment.vpc-id", "Values": [vid]}])["InternetGateways"]
        for igw in igws:
            ec2.detach_internet_gateway(InternetGatewayId=igw["InternetGatewayId"], VpcId=vid)
            ec2.delete_internet_gateway(InternetGatewayId=igw["InternetGatewayId"])
        for rt in ec2.describe_route_tables(Filters=by_vpc)["RouteTables"]:
            if not any(a.get("Main") for a in rt.get("Associations", [])):
                ec2.delete_route_table(RouteTableId=rt["RouteTableId"])
        for sg in ec2.describe_security_groups(Filters=by_vpc)["SecurityGroups"]:
            if sg["GroupName"] != "default":
                ec2.delete_security_group(GroupId=sg["GroupId"])
        ec2.delete_vpc(VpcId=vid)
        log.info("deleted the default VPC %s (%s)", vid, vpc["CidrBlock"])


def _ensure_vpc(ec2: Any, region: str) -> dict[str, str]:
    """The bed's VPC and one subnet per zone; {zone: subnet id}."""
    cidr = assert_loopback(vpc_cidr(region))
    found = ec2.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": [VPC_NAME]}])["Vpcs"]
    if found:
        vpc_id = found[0]["VpcId"]
    else:
        vpc_id = ec2.create_vpc(CidrBlock=cidr, TagSpecifications=[{
            "ResourceType": "vpc", "Tags": [{"Key": "Name", "Value": VPC_NAME}]}])["Vpc"]["VpcId"]
    subnets = {sn["AvailabilityZone"]: sn["SubnetId"] for sn in ec2.describe_subnets(
        Filters=[{"Name": "vpc-id", "Values": [vpc_id]}])["Subnets"]}
    zones = [z["ZoneName"] for z in ec2.describe_availability_zones()["AvailabilityZones"]
             if z.get("ZoneType", "availability-zone") == "availability-zone"]
    for zone in zones:
        if zone in subnets:
            continue
        sn = ec2.create_subnet(VpcId=vpc_id, CidrBlock=assert_loopback(subnet_cidr(region, zone)),
                               AvailabilityZone=zone, TagSpecifications=[{
                                   "ResourceType": "subnet",
                                   "Tags": [{"Key": "Name", "Value": f"{VPC_NAME}-{zone}"}]}])
        subnets[zone] = sn["Subnet"]["SubnetId"]
        # moto maps public IPs by default; the bed's machines only have private (loopback) ones
        ec2.modify_subnet_attribute(SubnetId=subnets[zone],
                                    MapPublicIpOnLaunch={"Value": False})
    _route_first_zone_to_internet(ec2, vpc_id, subnets[min(subnets)])
    return subnets


def _route_first_zone_to_internet(ec2: Any, vpc_id: str, subnet_id: str) -> None:
    """A mix, as users' own VPCs have: the first zone's subnet public (a route table of its
    own sending 0.0.0.0/0 to an internet gateway), the others private (the main table, with
    only the VPC's local route). Only the API says so: the bed's network routes nothing out
    (clusterd reaches its nodes at their private addresses, use_internal_ips)."""
    by_vpc = [{"Name": "attachment.vpc-id", "Values": [vpc_id]}]
    if ec2.describe_internet_gateways(Filters=by_vpc)["InternetGateways"]:
        return
    igw = ec2.create_internet_gateway()["InternetGateway"]["InternetGatewayId"]
    ec2.attach_internet_gateway(InternetGatewayId=igw, VpcId=vpc_id)
    table = ec2.create_route_table(VpcId=vpc_id)["RouteTable"]["RouteTableId"]
    ec2.create_route(RouteTableId=table, DestinationCidrBlock="0.0.0.0/0", GatewayId=igw)
    ec2.associate_route_table(RouteTableId=table, SubnetId=subnet_id)


def _ensure_image(backend: Any, region: str, name: str, owner: str, architecture: str,
                  description: str, public: bool, created: datetime.datetime,
                  alias: str | None = None) -> str:
    """The id of the image of that name and owner in region, registered straight into moto's
    backend if it is not there (the API cannot make images owned by another account, nor
    images without an instance)."""
    from moto.ec2.models.amis import Ami
    from moto.ec2.utils import random_ami_id

    have = [a for a in list(backend.amis.values()) if a.name == name and a.owner_id == owner]
    if have:
        return str(have[0].id)
    ami = Ami(backend, ami_id=random_ami_id(), name=name, owner_id=owner, description=description,
              public=public, virtualization_type="hvm", architecture=architecture,
              root_device_type="ebs", root_device_name="/dev/sda1",
              image_location=f"{owner}/{name}", hypervisor="xen", creation_date=created,
              region_name=f"{region}a")
    if alias is not None:  # what `Owners=["amazon"]` matches
        ami.owner_alias = alias
    backend.amis[ami.id] = ami
    return str(ami.id)


def _register_images(backend: Any, region: str) -> list[str]:
    """The public images (IMAGES). Returns their ids."""
    return [_ensure_image(backend, region, i.name, i.owner, i.architecture, i.description,
                          public=True, created=i.created, alias=i.alias) for i in IMAGES]


def register_runtime_image(backend: Any, region: str, key: str) -> str:
    """The bed's runtime image for wheelhouse KEY in region (the account's own, private);
    its id."""
    return _ensure_image(backend, region, runtime_image_name(key), ACCOUNT_ID, "x86_64",
                         f"clusterd test bed: Ubuntu 22.04 with the clusterd runtime {key}",
                         public=False, created=datetime.datetime.now(datetime.UTC))


def setup_region(ec2: Any, backend: Any, region: str) -> dict[str, Any]:
    """Make region the bed's (idempotent): no default VPC, the bed's VPC and subnets, images."""
    _delete_default_vpcs(ec2)
    subnets = _ensure_vpc(ec2, region)
    images = _register_images(backend, region)
    log.info("region %s: VPC %s, %d subnets, images %s", region, vpc_cidr(region),
             len(subnets), ", ".join(images))
    return {"subnets": subnets, "images": images}
