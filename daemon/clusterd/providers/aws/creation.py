"""What a cluster's EC2 instances are made from: the RunInstances request (image, disk,
network, metadata options, spot), the tags that find them again, the idempotency token of
each call, and which of the instances found are kept (one head, num_nodes-1 workers)."""

from __future__ import annotations

import getpass
import hashlib
import secrets
import socket
from typing import Any

from clusterd.providers.aws.ec2 import EC2Api, Instance, tag_value
from clusterd.providers.aws.limits import ebs_volume, node_name
from clusterd.providers.aws.network import TAG_CLOUD_NAME, TAG_MANAGED_BY
from clusterd.providers.base import ClusterRequest, Placement
from clusterd.user_config import AWSConfig

TAG_CLUSTER = "clusterd-cluster"
TAG_ROLE = "clusterd-node-role"
TAG_OWNER = "clusterd-owner"
DEFAULT_DISK_GB = 256  # as SkyPilot
# IMDSv2 only: the instance metadata (and an instance profile's credentials) answer only a
# session token's holder, so a request forged through a node's web app (SSRF) gets nothing.
# Two hops: a container on the node (docker's bridge is a hop) reaches it too.
IMDS_OPTIONS = {"HttpTokens": "required", "HttpEndpoint": "enabled",
                "HttpPutResponseHopLimit": 2}
NOT_ACCELERATOR_GPUS = ("inferentia", "trainium")


def launch_spec(config: AWSConfig, request: ClusterRequest, placement: Placement, *,
                image: str, root_device: str, key_name: str, subnet: str,
                security_group: str) -> dict[str, Any]:
    """RunInstances' arguments shared by the head's call and the workers'."""
    resources = request.resources
    launch: dict[str, Any] = {
        "ImageId": image,
        "InstanceType": placement.instance_type,
        "KeyName": key_name,
        "NetworkInterfaces": [{
            "DeviceIndex": 0, "SubnetId": subnet, "Groups": [security_group],
            "AssociatePublicIpAddress": not config.use_internal_ips,
            "DeleteOnTermination": True,
        }],
        "BlockDeviceMappings": [{
            "DeviceName": root_device,
            "Ebs": {"VolumeSize": resources.disk_size_gb or DEFAULT_DISK_GB,
                    "DeleteOnTermination": True, **ebs_volume(resources.disk_tier)},
        }],
        # A shutdown on the node (autostop) stops it, or ends it where it cannot come back.
        "InstanceInitiatedShutdownBehavior": (
            "terminate" if placement.spot or request.autostop_down else "stop"),
        "MetadataOptions": {**IMDS_OPTIONS},
    }
    if placement.spot:
        launch["InstanceMarketOptions"] = {"MarketType": "spot", "SpotOptions": {
            "SpotInstanceType": "one-time", "InstanceInterruptionBehavior": "terminate"}}
    return launch


def instance_tags(config: AWSConfig, request: ClusterRequest, managed_by: str,
                  role: str | None) -> list[dict[str, str]]:
    """The cluster's tags (its security group's, with no role) or a node's (with its role)."""
    owner = getpass.getuser()
    if config.owner_tag_hostname:
        owner += f"@{socket.gethostname()}"
    tags = {
        **dict(config.labels),
        **dict(request.resources.labels),
        TAG_CLOUD_NAME: request.cloud_name,
        TAG_CLUSTER: request.name,
        TAG_MANAGED_BY: managed_by,
        TAG_OWNER: owner,
        "Name": node_name(request.cloud_name, role) if role else request.cloud_name,
    }
    if role:
        tags[TAG_ROLE] = role
    return [{"Key": k, "Value": v} for k, v in tags.items()]


async def run_instances(api: EC2Api, region: str, zone: str, request: ClusterRequest,
                        launch: dict[str, Any], tags: list[dict[str, str]], role: str,
                        count: int) -> list[Instance]:
    answer = await api.call(
        region, "RunInstances", MinCount=count, MaxCount=count,
        ClientToken=client_token(request.create_token, zone, role, count),
        TagSpecifications=[{"ResourceType": "instance", "Tags": tags},
                           {"ResourceType": "volume", "Tags": tags}],
        **launch,
    )
    instances: list[Instance] = answer.get("Instances", [])
    for instance in instances:  # the answer may not carry the tags; we know the role
        instance.setdefault("Tags", [{"Key": TAG_ROLE, "Value": role}])
    return instances


def kept_and_extra(known: list[Instance], listed: list[Instance],
                   num_nodes: int) -> tuple[list[Instance], list[str]]:
    """Of the instances made or found (`known`) and those the listing shows (`listed`,
    fresher), the live ones kept (one head, num_nodes-1 workers, first made first) and the
    ids of the rest: a call that timed out but took effect, retried, on an EC2 without
    ClientToken support holds one too many."""
    by_id = {i["InstanceId"]: i for i in known}
    by_id.update({i["InstanceId"]: i for i in listed})
    order = [i["InstanceId"] for i in known] + [i["InstanceId"] for i in listed]
    instances = [by_id[i] for i in dict.fromkeys(order)
                 if by_id[i]["State"]["Name"] not in ("terminated", "shutting-down")]
    heads = [i for i in instances if tag_value(i, TAG_ROLE) == "head"]
    workers = [i for i in instances if tag_value(i, TAG_ROLE) != "head"]
    kept = heads[:1] + workers[: num_nodes - 1]
    return kept, [i["InstanceId"] for i in instances if i not in kept]


def client_token(create_token: str, zone: str, role: str, count: int) -> str:
    """RunInstances' ClientToken for one call of one launch attempt.

    EC2 binds a token to the reservation it made for 24 hours after its instances terminate:
    the same token again answers that (maybe dead) reservation and makes nothing, or
    IdempotentParameterMismatch. So it is derived from the attempt's create token, which the
    launcher records with the intent before the call: a call retried (by botocore, or by a
    launch resuming the same attempt after a crash) gets the same token and never doubles
    the instances, while a new attempt (a lost node made again, a relaunch) gets a new one.
    Hashed, since a ClientToken is readable by anyone who can describe the instances and
    the create token is the attempt's secret; 48 hex characters (EC2 takes up to 64).
    A caller without a create token (no recorded intent) gets a token of its own."""
    seed = create_token or secrets.token_hex(16)
    return hashlib.sha256(f"{seed}/{zone}/{role}/{count}".encode()).hexdigest()[:48]


def gpus_of(accelerator: str | None, count: float) -> float:
    if not accelerator or accelerator.lower().startswith(NOT_ACCELERATOR_GPUS):
        return 0.0
    return count
