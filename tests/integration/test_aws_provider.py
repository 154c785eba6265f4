"""The aws provider against a real EC2 API: moto's server, over HTTP, as its own process.

No nodes answer SSH here (the EC2 test bed's end-to-end tests do that): these drive the
provider's EC2 calls directly, found the standard way (AWS_ENDPOINT_URL_EC2 and a throw-away
credentials file) and check what they leave in moto.

Like every cloud test, they run in a network namespace with only `lo`, so that no bug can
send a packet to a real address: test_aws_provider_isolated.py runs this module in one
(`unshare --net`); run directly, outside one, it skips.
"""

from __future__ import annotations

import dataclasses
import datetime
import getpass
import json
import os
import socket
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import asyncssh
import boto3
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.nodes import NodeStatus
from clusterd.providers.aws import profile
from clusterd.providers.aws.creation import TAG_OWNER, TAG_ROLE
from clusterd.providers.aws.handle import AWSHandle
from clusterd.providers.aws.network import TAG_CLOUD_NAME, TAG_MANAGED_BY
from clusterd.providers.aws.provider import AWSProvider
from clusterd.providers.base import BlockScope, ClusterRequest, Placement, ProvisionError
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.keys import DaemonKey
from clusterd.storage.service import temporary_credentials_warning
from clusterd.tasks.loader import parse_resources
from clusterd.tasks.spec import ResourceRequest
from clusterd.user_config import UserConfig, parse
from tests.integration.moto_server import (
    IN_NETNS,
    aws_environment,
    make_loopback_vpc,
    moto_server,
    ubuntu_image,
)

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.environ.get(IN_NETNS),
                       reason="runs in a network namespace of its own, through "
                       "test_aws_provider_isolated.py"),
]
REGIONS = {"us-east-1": 1, "us-west-2": 4}
IMAGE = "ami-0a0b0c0d0e0f01234"
# Another daemon sharing the AWS account (its state directory, its id).
OTHER_DAEMON = "clusterd-someone-else"


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    scratch = tmp_path_factory.mktemp("moto")
    with moto_server(scratch, ubuntu_image(scratch, IMAGE)) as endpoint:
        for region, number in REGIONS.items():
            make_loopback_vpc(endpoint, region, number)
        yield endpoint


def ec2(endpoint: str, region: str) -> Any:
    return boto3.client("ec2", region_name=region, endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


@pytest.fixture
def env(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return aws_environment(tmp_path, moto, ("ec2", "sts", "iam"), monkeypatch)


@pytest.fixture
async def provider(env: Path) -> AsyncIterator[AWSProvider]:
    config = parse(env / "config.yaml", "aws:\n  vpc_name: loopback\n  use_internal_ips: true\n"
                   "  labels: {team: infra}\n")
    aws = AWSProvider(lambda: config, SSHConnections(HostKeyStore(env / "known_hosts")),
                      DaemonKey(env / "ssh"), f"clusterd-test-{os.getpid()}")
    try:
        yield aws
    finally:
        await aws.aclose()


def request(name: str, nodes: int = 1, **resources: object) -> ClusterRequest:
    return ClusterRequest(name, f"{name}-c0ffee", nodes, parse_resources(resources, "t.yaml"))


def tagged(endpoint: str, region: str, cloud_name: str) -> list[dict[str, Any]]:
    reservations = ec2(endpoint, region).describe_instances(Filters=[
        {"Name": f"tag:{TAG_CLOUD_NAME}", "Values": [cloud_name]}])["Reservations"]
    return [i for r in reservations for i in r["Instances"]]


async def test_placements_are_cheapest_first_with_zone_names(provider: AWSProvider) -> None:
    placements = await provider.placements(request("p", cpus=2, infra="aws/us-east-1"))
    assert {p.region for p in placements} == {"us-east-1"}
    assert all(p.zone and p.zone.startswith("us-east-1") for p in placements)
    prices = [p.price_per_hour for p in placements]
    assert prices == sorted(prices) and placements[0].cpus == 2
    zoned = await provider.placements(request("p", cpus=2, infra="aws/us-east-1/us-east-1c"))
    assert [p.zone for p in zoned] == ["us-east-1c"]
    with pytest.raises(ProvisionError) as miss:
        await provider.placements(request("p", accelerators="A100:3"))
    assert miss.value.scope == BlockScope.PROVIDER and "p4d.24xlarge" in miss.value.message


async def test_create_query_stop_start_terminate(provider: AWSProvider, moto: str) -> None:
    want = request("duo", nodes=2, cpus=2, ports=[8080, "9000-9010"], infra="aws/us-east-1",
                   labels={"project": "x"})
    placement = (await provider.placements(want))[0]
    handle = await provider.create(want, placement)
    instances = tagged(moto, "us-east-1", want.cloud_name)
    assert len(instances) == 2
    roles = sorted(next(t["Value"] for t in i["Tags"] if t["Key"] == TAG_ROLE)
                   for i in instances)
    assert roles == ["head", "worker"]
    tags = {t["Key"]: t["Value"] for t in instances[0]["Tags"]}
    assert tags[TAG_MANAGED_BY] == provider.managed_by
    assert tags["team"] == "infra" and tags["project"] == "x"
    assert all(i["PrivateIpAddress"].startswith("127.1.") for i in instances)
    assert all(i["Placement"]["AvailabilityZone"] == placement.zone for i in instances)
    assert handle.nodes[0].role == "head"
    # The root volumes: SkyPilot's default disk tier (medium: gp3).
    volumes = ec2(moto, "us-east-1").describe_volumes(Filters=[
        {"Name": "attachment.instance-id", "Values": [i["InstanceId"] for i in instances]}])
    assert {v["VolumeType"] for v in volumes["Volumes"]} == {"gp3"}
    # The security group: SSH and the task's ports from anywhere, everything from its members.
    group = ec2(moto, "us-east-1").describe_security_groups(
        GroupIds=[handle.security_group])["SecurityGroups"][0]
    tcp = [p for p in group["IpPermissions"] if p["IpProtocol"] == "tcp"]
    assert {(p["FromPort"], p["ToPort"]) for p in tcp} == {(22, 22), (8080, 8080), (9000, 9010)}
    assert all(p["IpRanges"] == [{"CidrIp": "0.0.0.0/0"}] for p in tcp)
    members = [p for p in group["IpPermissions"] if p["IpProtocol"] == "-1"]
    assert [[pair["GroupId"] for pair in p["UserIdGroupPairs"]] for p in members] == [
        [handle.security_group]]
    assert all(not p.get("IpRanges") for p in members)
    # Create again (a resumed launch): the same instances, none added.
    again = await provider.create(want, placement)
    assert {n.id for n in again.nodes} == {n.id for n in handle.nodes}
    nodes = await provider.query(want.cloud_name, handle)
    assert [n.status for n in nodes] == [NodeStatus.RUNNING] * 2
    info = await provider.cluster_info(want.cloud_name, handle)
    assert info.head.ssh is not None and info.head.ssh.user == "ubuntu"
    assert info.head.ssh.host_key_alias == handle.nodes[0].id

    await provider.stop(want.cloud_name, handle)
    assert {n.status for n in await provider.query(want.cloud_name, handle)} == {
        NodeStatus.STOPPED}
    await provider.terminate(want.cloud_name, handle)
    await provider.cleanup_ports(want.cloud_name, handle)
    assert {i["State"]["Name"] for i in tagged(moto, "us-east-1", want.cloud_name)} == {
        "terminated"}
    groups = ec2(moto, "us-east-1").describe_security_groups(Filters=[
        {"Name": f"tag:{TAG_CLOUD_NAME}", "Values": [want.cloud_name]}])["SecurityGroups"]
    assert groups == []
    gone = await provider.query(want.cloud_name, handle)
    assert {n.status for n in gone} == {NodeStatus.TERMINATED}


async def test_disk_tier_and_max_hourly_cost(provider: AWSProvider, moto: str) -> None:
    sent: list[dict[str, Any]] = []
    client = await provider.api.client("ec2", "us-east-1")
    client.meta.events.register("provide-client-params.ec2.RunInstances",
                                lambda params, **_: sent.append(params))
    for tier, volume_type in (("low", "standard"), ("high", "gp3")):
        want = request(f"tier-{tier}", cpus=2, infra="aws/us-east-1", disk_tier=tier,
                       disk_size=64)
        handle = await provider.create(want, (await provider.placements(want))[0])
        volumes = ec2(moto, "us-east-1").describe_volumes(Filters=[
            {"Name": "attachment.instance-id", "Values": [n.id for n in handle.nodes]}])
        assert [(v["VolumeType"], v["Size"]) for v in volumes["Volumes"]] == [
            (volume_type, 64)]
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)
    # moto keeps no IOPS (and so cannot make io2, the ultra tier): what was asked shows them.
    assert sent[-1]["BlockDeviceMappings"][0]["Ebs"] == {
        "VolumeSize": 64, "DeleteOnTermination": True, "VolumeType": "gp3", "Iops": 7000,
        "Throughput": 437}
    # max_hourly_cost leaves out what costs more (per node and hour, the catalog's price).
    from clusterd.providers.registry import ProviderRegistry
    from clusterd.provision.candidates import candidates, plan

    registry = ProviderRegistry([provider])
    cheap = request("cheap", accelerators="A10G:1", max_hourly_cost=0.5).resources
    found = await candidates((cheap,), None, registry)
    with pytest.raises(ProvisionError) as too_dear:  # the only candidate: its refusal as is
        await plan(found, registry, "cheap", "cheap-1", 1, False, False)
    assert "resources.max_hourly_cost: every place costs more than $0.5" in (
        too_dear.value.message)
    enough = request("ok", accelerators="A10G:1", max_hourly_cost=1.2).resources
    found = await candidates((enough,), None, registry)
    options, _ = await plan(found, registry, "ok", "ok-1", 1, False, False)
    assert options and all(o.placement.price_per_hour <= 1.2 for o in options)


async def test_one_describe_per_region_answers_many_clusters(provider: AWSProvider) -> None:
    handles = {}
    for index in range(3):
        want = request(f"many{index}", cpus=2, infra="aws/us-west-2")
        handles[want.cloud_name] = await provider.create(want, (await provider.placements(want))[0])
    provider.api.calls.clear()
    found = await provider.query_many(list(handles.items()))
    assert provider.api.calls == {("DescribeInstances", "us-west-2"): 1}
    assert all(len(nodes) == 1 for nodes in found.values() if isinstance(nodes, list))
    for cloud_name, handle in handles.items():
        await provider.terminate(cloud_name, handle)
        await provider.cleanup_ports(cloud_name, handle)


async def test_a_failed_create_leaves_nothing(provider: AWSProvider, moto: str) -> None:
    want = request("broken", cpus=2, infra="aws/us-east-1", image_id="ami-00000000000000000")
    placement = (await provider.placements(want))[0]
    with pytest.raises(ProvisionError) as failed:
        await provider.create(want, placement)
    assert failed.value.scope == BlockScope.REGION
    assert [i for i in tagged(moto, "us-east-1", want.cloud_name)
            if i["State"]["Name"] != "terminated"] == []


async def test_public_addresses_only_in_subnets_routing_to_an_internet_gateway(
        provider: AWSProvider, env: Path, moto: str) -> None:
    config = parse(env / "c.yaml", "aws:\n  vpc_name: loopback\n")  # public addresses
    provider._config = lambda: config  # type: ignore[method-assign]
    want = request("pub", cpus=2, infra="aws/us-east-1")
    by_zone = {p.zone: p for p in await provider.placements(want)}
    client = ec2(moto, "us-east-1")
    subnets = {s["AvailabilityZone"]: s["SubnetId"] for s in client.describe_subnets()[
        "Subnets"]}
    # us-east-1b's only subnet is private (the VPC's main table has no internet route).
    with pytest.raises(ProvisionError) as failed:
        await provider.create(want, by_zone["us-east-1b"])
    assert failed.value.scope == BlockScope.ZONE
    assert "no subnet of the VPC" in failed.value.message
    assert subnets["us-east-1b"] in failed.value.message
    assert "use_internal_ips" in failed.value.hint
    assert tagged(moto, "us-east-1", want.cloud_name) == []
    # us-east-1a's routes to an internet gateway (a table of its own).
    handle = await provider.create(want, by_zone["us-east-1a"])
    try:
        assert handle.subnet == subnets["us-east-1a"]
    finally:
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)
    # With use_internal_ips, any subnet will do.
    internal = parse(env / "i.yaml", "aws:\n  vpc_name: loopback\n  use_internal_ips: true\n")
    provider._config = lambda: internal  # type: ignore[method-assign]
    handle = await provider.create(want, by_zone["us-east-1b"])
    try:
        assert handle.subnet == subnets["us-east-1b"]
    finally:
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)


async def test_no_vpc_rules_out_the_region(provider: AWSProvider, env: Path) -> None:
    config = parse(env / "c.yaml", "aws:\n  vpc_name: nowhere\n")
    provider._config = lambda: config  # type: ignore[method-assign]
    want = request("novpc", cpus=2, infra="aws/us-east-1")
    with pytest.raises(ProvisionError) as failed:
        await provider.create(want, (await provider.placements(want))[0])
    assert failed.value.scope == BlockScope.REGION and "no VPC named 'nowhere'" in (
        failed.value.message)


async def test_check_reports_identity_and_regions(provider: AWSProvider) -> None:
    result = await provider.check()
    assert result["ok"] and "arn:aws" in result["identity"]
    assert "us-east-1" in result["regions"]


async def test_check_is_fast_and_clear_without_credentials(
        provider: AWSProvider, monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    fresh = AWSProvider(lambda: UserConfig(tmp_path / "c"),
                        provider._connections, DaemonKey(tmp_path / "k"), "x")
    result = await fresh.check()
    assert not result["ok"] and "no AWS credentials" in result["detail"]
    await fresh.aclose()


def test_requests_are_dataclasses() -> None:
    # The request given to create carries the autostop choice for the shutdown behaviour.
    assert "autostop_down" in {f.name for f in dataclasses.fields(ClusterRequest)}


async def test_accelerator_choices_are_candidates_cheapest_first(provider: AWSProvider) -> None:
    from clusterd.providers.registry import ProviderRegistry
    from clusterd.provision.candidates import candidates, plan
    from clusterd.tasks.loader import load_task

    registry = ProviderRegistry([provider])
    task = load_task(yaml_text="resources:\n  infra: aws\n  accelerators: {H100: 8, L4: 1}\n",
                     source="t.yaml")
    found = await candidates(task.resource_options(), None, registry)
    options, refusals = await plan(found, registry, "acc", "acc-1", 1, False, False)
    assert refusals == [] and options[0].placement.accelerator == "L4"
    assert {o.placement.accelerator for o in options} == {"L4", "H100"}
    # Nothing fits: every candidate says why, and the table lists them all.
    none = load_task(yaml_text="resources:\n  infra: aws\n  accelerators: {A100: 3, B200: 8}\n",
                     source="t.yaml")
    found = await candidates(none.resource_options(), None, registry)
    options, refusals = await plan(found, registry, "none", "none-1", 1, False, False)
    assert options == []
    assert [r.resources for r in refusals] == ["1x[CPU:0.5, A100:3]", "1x[CPU:0.5, B200:8]"]
    assert "nearest: A100:8 on p4d.24xlarge" in refusals[0].reason
    assert "no instance type has B200" in refusals[1].reason


# -- one AWS account, several daemons -------------------------------------------------------


def foreign_instance(endpoint: str, region: str, cloud_name: str, role: str = "head") -> str:
    """An instance another clusterd made for a cluster of the same name on the cloud."""
    client = ec2(endpoint, region)
    subnet = client.describe_subnets()["Subnets"][0]["SubnetId"]
    tags = [{"Key": TAG_CLOUD_NAME, "Value": cloud_name},
            {"Key": TAG_MANAGED_BY, "Value": OTHER_DAEMON}, {"Key": TAG_ROLE, "Value": role}]
    answer = client.run_instances(ImageId=IMAGE, InstanceType="c6i.large", MinCount=1,
                                  MaxCount=1, SubnetId=subnet, TagSpecifications=[
                                      {"ResourceType": "instance", "Tags": tags}])
    return str(answer["Instances"][0]["InstanceId"])


def state_of(endpoint: str, region: str, instance: str) -> str:
    reservations = ec2(endpoint, region).describe_instances(InstanceIds=[instance])
    return str(reservations["Reservations"][0]["Instances"][0]["State"]["Name"])


def ours_alive(endpoint: str, region: str, cloud_name: str) -> list[str]:
    return [i["InstanceId"] for i in tagged(endpoint, region, cloud_name)
            if i["State"]["Name"] != "terminated"
            and {t["Key"]: t["Value"] for t in i["Tags"]}[TAG_MANAGED_BY] != OTHER_DAEMON]


def listen(provider: AWSProvider) -> list[str]:
    """What the provider reports as another clusterd's, left alone (the daemon turns each
    into a warning in the request's output and an event)."""
    heard: list[str] = []

    async def on_foreign(cloud_name: str, text: str) -> None:
        heard.append(f"{cloud_name}: {text}")

    provider.on_foreign = on_foreign
    return heard


def told(heard: list[str], *words: str) -> bool:
    return any(all(word in line for word in words) for line in heard)


async def test_another_daemons_instance_of_the_same_name_is_never_ours(
        provider: AWSProvider, moto: str) -> None:
    """Launch, a repairing launch, stop and down act on this daemon's instances only."""
    want = request("shared", nodes=2, cpus=2, infra="aws/us-east-1")
    theirs = foreign_instance(moto, "us-east-1", want.cloud_name)
    heard = listen(provider)
    placement = (await provider.placements(want))[0]
    handle = await provider.create(want, placement)
    ours = {n.id for n in handle.nodes}
    # Its head is not ours to use: we made our own, and did not terminate theirs as extra.
    assert theirs not in ours and len(ours) == 2
    assert [n.role for n in handle.nodes] == ["head", "worker"]
    assert state_of(moto, "us-east-1", theirs) == "running"
    assert told(heard, want.cloud_name, theirs, OTHER_DAEMON, "left alone")

    # A repairing launch (our worker lost behind our back) makes our worker again.
    worker = handle.nodes[1].id
    ec2(moto, "us-east-1").terminate_instances(InstanceIds=[worker])
    heard.clear()
    repaired = await provider.create(want, placement)
    assert repaired.nodes[0].id == handle.nodes[0].id
    assert {n.id for n in repaired.nodes}.isdisjoint({theirs, worker})
    assert state_of(moto, "us-east-1", theirs) == "running"
    assert told(heard, theirs, OTHER_DAEMON)

    heard.clear()
    await provider.stop(want.cloud_name, repaired)
    assert state_of(moto, "us-east-1", theirs) == "running"
    assert {state_of(moto, "us-east-1", n.id) for n in repaired.nodes} == {"stopped"}
    assert told(heard, theirs, OTHER_DAEMON)

    heard.clear()
    await provider.terminate(want.cloud_name, repaired)
    await provider.cleanup_ports(want.cloud_name, repaired)
    assert state_of(moto, "us-east-1", theirs) == "running"
    assert ours_alive(moto, "us-east-1", want.cloud_name) == []
    assert told(heard, theirs, OTHER_DAEMON)


async def test_a_failed_launch_cleans_up_only_its_own_instances(
        provider: AWSProvider, moto: str) -> None:
    want = request("shared-broken", cpus=2, infra="aws/us-east-1",
                   image_id="ami-00000000000000000")
    theirs = foreign_instance(moto, "us-east-1", want.cloud_name)
    heard = listen(provider)
    with pytest.raises(ProvisionError):
        await provider.create(want, (await provider.placements(want))[0])
    assert state_of(moto, "us-east-1", theirs) == "running"
    # The launch's own clean-up after a failed attempt (terminate with the intent).
    intent = provider.handle_for_intent(want.cloud_name, Placement(
        "aws", "us-east-1", None, "c6i.large", 2, 4))
    await provider.terminate(want.cloud_name, intent)
    await provider.cleanup_ports(want.cloud_name, intent)
    assert state_of(moto, "us-east-1", theirs) == "running"
    assert told(heard, want.cloud_name, theirs, OTHER_DAEMON)


async def test_another_daemons_security_group_of_the_same_name_is_left_alone(
        provider: AWSProvider, moto: str) -> None:
    want = request("shared-group", cpus=2, infra="aws/us-east-1")
    client = ec2(moto, "us-east-1")
    vpc = client.describe_vpcs(Filters=[{"Name": "tag:Name", "Values": ["loopback"]}])[
        "Vpcs"][0]["VpcId"]
    theirs = client.create_security_group(
        GroupName=f"clusterd-{want.cloud_name}", VpcId=vpc, Description="another clusterd's",
        TagSpecifications=[{"ResourceType": "security-group", "Tags": [
            {"Key": TAG_CLOUD_NAME, "Value": want.cloud_name},
            {"Key": TAG_MANAGED_BY, "Value": OTHER_DAEMON}]}])["GroupId"]
    heard = listen(provider)
    await provider.cleanup_ports(want.cloud_name, AWSHandle("us-east-1"))
    assert client.describe_security_groups(GroupIds=[theirs])["SecurityGroups"]
    assert told(heard, want.cloud_name, theirs, OTHER_DAEMON)
    # Launching into it would share its rules with a stranger: refused, saying why.
    with pytest.raises(ProvisionError) as refused:
        await provider.create(want, (await provider.placements(want))[0])
    assert refused.value.scope == BlockScope.FATAL
    assert theirs in refused.value.message and OTHER_DAEMON in refused.value.message
    assert "another clusterd" in refused.value.message and refused.value.hint
    assert ours_alive(moto, "us-east-1", want.cloud_name) == []
    assert client.describe_security_groups(GroupIds=[theirs])["SecurityGroups"]


async def test_a_key_pair_of_our_name_holding_another_key_is_refused(
        provider: AWSProvider, moto: str, env: Path) -> None:
    name = f"clusterd-{DaemonKey(env / 'ssh').ensure().digest}"
    squatter = asyncssh.generate_private_key("ssh-ed25519").export_public_key()
    client = ec2(moto, "us-east-1")
    client.import_key_pair(KeyName=name, PublicKeyMaterial=squatter)
    want = request("squat", cpus=2, infra="aws/us-east-1")
    placement = (await provider.placements(want))[0]
    with pytest.raises(ProvisionError) as refused:
        await provider.create(want, placement)
    assert refused.value.scope == BlockScope.FATAL
    assert f"key pair {name}" in refused.value.message
    assert "not this daemon's key" in refused.value.message
    assert f"aws ec2 delete-key-pair --region us-east-1 --key-name {name}" in (
        refused.value.hint)
    assert ours_alive(moto, "us-east-1", want.cloud_name) == []
    # Once it is gone, ours is imported; a daemon starting afresh finds it and accepts it.
    client.delete_key_pair(KeyName=name)
    await provider.create(want, placement)
    fresh = AWSProvider(provider._config, provider._connections, DaemonKey(env / "ssh"),
                        provider.managed_by)
    try:
        handle = await fresh.create(want, placement)
        await fresh.terminate(want.cloud_name, handle)
        await fresh.cleanup_ports(want.cloud_name, handle)
    finally:
        await fresh.aclose()


async def test_instances_require_imdsv2(provider: AWSProvider, moto: str) -> None:
    want = request("imds", cpus=2, infra="aws/us-east-1")
    handle = await provider.create(want, (await provider.placements(want))[0])
    (instance,) = tagged(moto, "us-east-1", want.cloud_name)
    options = instance["MetadataOptions"]
    assert (options["HttpTokens"], options["HttpEndpoint"]) == ("required", "enabled")
    assert options["HttpPutResponseHopLimit"] == 2  # a container on the node reaches it too
    await provider.terminate(want.cloud_name, handle)
    await provider.cleanup_ports(want.cloud_name, handle)


async def test_the_owner_tag_names_the_host_only_when_asked(
        provider: AWSProvider, moto: str, env: Path) -> None:
    def owner(cloud_name: str) -> str:
        (instance,) = [i for i in tagged(moto, "us-east-1", cloud_name)
                       if i["State"]["Name"] != "terminated"]
        return str({t["Key"]: t["Value"] for t in instance["Tags"]}[TAG_OWNER])

    for setting, expected in (("", getpass.getuser()),
                              ("  owner_tag_hostname: true\n",
                               f"{getpass.getuser()}@{socket.gethostname()}")):
        config = parse(env / "c.yaml", "aws:\n  vpc_name: loopback\n  use_internal_ips: true\n"
                       + setting)
        provider._config = lambda config=config: config  # type: ignore[method-assign]
        want = request("owner", cpus=2, infra="aws/us-east-1")
        want = dataclasses.replace(want, cloud_name=f"owner-{len(setting)}")
        handle = await provider.create(want, (await provider.placements(want))[0])
        assert owner(want.cloud_name) == expected
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)
    with pytest.raises(ProtocolError, match=r"aws\.owner_tag_hostname: expected true or false"):
        parse(env / "c.yaml", "aws:\n  owner_tag_hostname: 1\n")


async def test_the_daemon_tells_the_user_once_and_keeps_an_event(
        moto: str, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What another clusterd's instance looks like to a user of this one: the daemon's own
    provider, wired as the daemon wires it, says it in the running request's output once
    (however often one operation meets it) and keeps it as an event of the cluster."""
    import time

    from clusterctl.protocol import ClusterStatus
    from clusterd.app import Daemon
    from clusterd.config import Settings
    from clusterd.requests import RunningRequest, current_request
    from clusterd.state.clusters import ClusterRecord

    (env / "config.yaml").write_text("aws:\n  vpc_name: loopback\n  use_internal_ips: true\n")
    monkeypatch.setenv("CLUSTERD_CONFIG", str(env / "config.yaml"))
    daemon = Daemon(Settings(socket_path=env / "run" / "clusterd.sock",
                             runtime_dir=env / "run", state_dir=env / "state",
                             config_dir=env / "config"))
    await daemon.db.open()
    try:
        await daemon.store.load()
        cloud_name, now = "mine-c0ffee", time.time()
        await daemon.store.insert(ClusterRecord(
            "mine", "aws", cloud_name, ClusterStatus.UP, 1, ResourceRequest(), "", now, now),
            "test", None)
        theirs = foreign_instance(moto, "us-east-1", cloud_name)
        request = RunningRequest(await daemon.request_store.create("down", "mine", {}))
        token = current_request.set(request)
        try:
            for _ in range(2):  # as a failed attempt's clean-up and then the launch's do
                await daemon.providers.get("aws").terminate(cloud_name, AWSHandle("us-east-1"))
        finally:
            current_request.reset(token)
        assert state_of(moto, "us-east-1", theirs) == "running"
        said = [data["message"] for kind, data in request._events
                if kind == "progress" and theirs in data["message"]]
        assert len(said) == 1 and said[0].startswith("warning: aws/us-east-1: 1 instance "
                                                     f"tagged as cluster {cloud_name}")
        assert f"clusterd-managed-by: {OTHER_DAEMON}" in said[0]
        events = await daemon.store.events("mine", 20)
        assert [(e.kind, e.request_id) for e in events if theirs in e.reason] == [
            ("foreign", request.id)]
    finally:
        await daemon.providers.get("aws").aclose()
        await daemon.db.close()


def iam_client(endpoint: str) -> Any:
    return boto3.client("iam", region_name="us-east-1", endpoint_url=endpoint,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def role_grants(endpoint: str, role: str) -> set[str]:
    """The buckets the role's inline policies grant, together."""
    iam = iam_client(endpoint)
    return set().union(*(profile.granted_buckets(
        iam.get_role_policy(RoleName=role, PolicyName=name)["PolicyDocument"])
        for name in iam.list_role_policies(RoleName=role)["PolicyNames"]))


def node_role(endpoint: str, instance: str) -> str:
    """The role of the instance profile an instance holds."""
    associations = ec2(endpoint, "us-east-1").describe_iam_instance_profile_associations(
        Filters=[{"Name": "instance-id", "Values": [instance]}])[
        "IamInstanceProfileAssociations"]
    name = associations[0]["IamInstanceProfile"]["Arn"].split("/")[-1]
    roles = iam_client(endpoint).get_instance_profile(InstanceProfileName=name)[
        "InstanceProfile"]["Roles"]
    assert len(roles) == 1, roles
    return str(roles[0]["RoleName"])


async def test_buckets_are_granted_through_the_daemons_instance_profile(
        provider: AWSProvider, moto: str) -> None:
    """The daemon's role is made once; each grant adds the buckets it names to the cluster's
    policy (none is dropped while the cluster lives); every instance holds the profile."""
    iam = iam_client(moto)
    role = profile.role_name(provider.managed_by)
    want = request("granted", nodes=2, cpus=2, infra="aws/us-east-1")
    handle = await provider.create(want, (await provider.placements(want))[0])
    try:
        assert await provider.grant_buckets(want.cloud_name, handle, ("ckpt", "data")) is True
        assert await provider.grant_buckets(want.cloud_name, handle, ("more",)) is True
        policy = iam.get_role_policy(RoleName=role,
                                     PolicyName=profile.cluster_policy_name(want.cloud_name))
        assert profile.granted_buckets(policy["PolicyDocument"]) == {"ckpt", "data", "more"}
        statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
        assert statements["Objects"]["Resource"] == [
            "arn:aws:s3:::ckpt/*", "arn:aws:s3:::data/*", "arn:aws:s3:::more/*"]
        assert "s3:PutObject" in statements["Objects"]["Action"]
        assert "s3:DeleteBucket" not in statements["Buckets"]["Action"]
        trust = iam.get_role(RoleName=role)["Role"]["AssumeRolePolicyDocument"]
        assert "ec2.amazonaws.com" in json.dumps(trust)
        associations = ec2(moto, "us-east-1").describe_iam_instance_profile_associations()[
            "IamInstanceProfileAssociations"]
        held = {a["InstanceId"]: a["IamInstanceProfile"]["Arn"] for a in associations}
        arn = iam.get_instance_profile(InstanceProfileName=role)["InstanceProfile"]["Arn"]
        assert {i: held[i] for i in handle.instance_ids} == {n.id: arn for n in handle.nodes}
    finally:
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)


async def test_two_daemons_in_one_account_grant_each_its_own_buckets(
        provider: AWSProvider, moto: str, env: Path) -> None:
    """Another daemon's grants never reach this daemon's nodes, nor overwrite its own: each
    daemon's nodes hold a role of its own, granting only its clusters' buckets."""
    other = AWSProvider(provider._config, SSHConnections(HostKeyStore(env / "known_hosts")),
                        DaemonKey(env / "ssh-other"), OTHER_DAEMON)
    mine, theirs = request("mine-b", cpus=2, infra="aws/us-east-1"), request(
        "theirs-b", cpus=2, infra="aws/us-east-1")
    my_handle = await provider.create(mine, (await provider.placements(mine))[0])
    their_handle = await other.create(theirs, (await other.placements(theirs))[0])
    try:
        await provider.grant_buckets(mine.cloud_name, my_handle, ("my-data",))
        await other.grant_buckets(theirs.cloud_name, their_handle, ("their-data",))
        await provider.grant_buckets(mine.cloud_name, my_handle, ("my-ckpt",))
        my_role = node_role(moto, my_handle.nodes[0].id)
        their_role = node_role(moto, their_handle.nodes[0].id)
        assert role_grants(moto, my_role) == {"my-data", "my-ckpt"}
        assert role_grants(moto, their_role) == {"their-data"}
        assert my_role == profile.role_name(provider.managed_by)
    finally:
        for aws, want, handle in ((provider, mine, my_handle), (other, theirs, their_handle)):
            await aws.terminate(want.cloud_name, handle)
            await aws.cleanup_ports(want.cloud_name, handle)
        await other.aclose()


async def test_a_buckets_grant_goes_with_the_last_cluster_using_it(
        provider: AWSProvider, moto: str) -> None:
    """When a cluster goes, the role stops granting its buckets, except those another of this
    daemon's clusters still uses."""
    first, second = request("first-b", cpus=2, infra="aws/us-east-1"), request(
        "second-b", cpus=2, infra="aws/us-east-1")
    handles = {want.cloud_name: await provider.create(want, (await provider.placements(
        want))[0]) for want in (first, second)}
    try:
        await provider.grant_buckets(first.cloud_name, handles[first.cloud_name],
                                     ("shared", "only-first"))
        await provider.grant_buckets(second.cloud_name, handles[second.cloud_name],
                                     ("shared",))
        role = node_role(moto, handles[second.cloud_name].nodes[0].id)
        assert role_grants(moto, role) == {"shared", "only-first"}
        await provider.terminate(first.cloud_name, handles[first.cloud_name])
        await provider.cleanup_ports(first.cloud_name, handles[first.cloud_name])
        assert role_grants(moto, role) == {"shared"}
        await provider.terminate(second.cloud_name, handles[second.cloud_name])
        await provider.cleanup_ports(second.cloud_name, handles[second.cloud_name])
        assert role_grants(moto, role) == set()
        # Gone is success: a teardown tried again removes nothing more, and fails nothing.
        await provider.cleanup_ports(first.cloud_name, handles[first.cloud_name])
    finally:
        for want in (first, second):
            await provider.terminate(want.cloud_name, handles[want.cloud_name])


async def test_temporary_credentials_say_when_they_expire(env: Path, moto: str,
                                                          monkeypatch: pytest.MonkeyPatch
                                                          ) -> None:
    """An assumed role (STS AssumeRole with a short DurationSeconds, as an SSO or role
    profile gives): clusterd sees that its credentials are temporary and when they expire."""
    from clusterd.providers.aws.ec2 import EC2Api

    plain = EC2Api(lambda: 30.0)
    try:
        assert await plain.credentials_lifetime() is None  # long-lived keys
    finally:
        await plain.aclose()
    (env / "config").write_text(
        "[default]\nregion = us-east-1\n"
        "[profile short]\nregion = us-east-1\nsource_profile = default\n"
        "role_arn = arn:aws:iam::123456789012:role/clusterd-short\nduration_seconds = 900\n")
    monkeypatch.setenv("AWS_PROFILE", "short")
    before = datetime.datetime.now(datetime.UTC)
    api = EC2Api(lambda: 30.0)
    try:
        lifetime = await api.credentials_lifetime()
    finally:
        await api.aclose()
    assert lifetime is not None and lifetime.method == "assume-role"
    assert lifetime.expires_at is not None
    left = (lifetime.expires_at - before).total_seconds()
    assert 800 < left <= 960
    text = temporary_credentials_warning(lifetime, 2, before)
    assert "are temporary (assume-role) and expire at " in text and "(in 15 min)" in text
