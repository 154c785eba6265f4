"""Account boundaries as AWS enforces them, on moto's server with its IAM enforcement on: every
request is checked against its caller's policies, and another account's bucket refuses this
account's keys (HeadBucket 403, as on S3).

clusterd runs with the keys of a user holding exactly README's policy
(docs/aws-iam-policy.json); a node's role reaches only the buckets its policy names.

Run in a network namespace with only `lo` by test_aws_provider_isolated.py; run directly,
outside one, it skips.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import boto3
import botocore.exceptions
import pytest

from clusterd.nodes import NodeStatus
from clusterd.providers.aws import profile
from clusterd.providers.aws.ec2 import EC2Api
from clusterd.providers.aws.provider import AWSProvider
from clusterd.providers.base import ClusterRequest
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.keys import DaemonKey
from clusterd.storage.s3 import S3Buckets, StorageError
from clusterd.tasks.loader import parse_resources
from clusterd.user_config import parse
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
ROOT = Path(__file__).resolve().parents[2]
README_POLICY = ROOT / "docs/aws-iam-policy.json"
IMAGE = "ami-0a0b0c0d0e0f05678"
OTHER_ACCOUNT = "222222222222"
THEIR_BUCKET = "their-bucket"
DAEMON_ID = "clusterd-0123456789ab"
Keys = tuple[str, str]


def client(service: str, endpoint: str, keys: Keys, account: str | None = None,
           token: str | None = None) -> Any:
    made = boto3.client(service, region_name="us-east-1", endpoint_url=endpoint,
                        aws_access_key_id=keys[0], aws_secret_access_key=keys[1],
                        aws_session_token=token)
    if account is not None:  # moto's way to act as another account (before enforcement)
        made.meta.events.register("before-sign.*.*", lambda request, **_: request.headers
                                  .__setitem__("x-moto-account-id", account))
    return made


def request(name: str) -> ClusterRequest:
    return ClusterRequest(name, f"{name}-c0ffee", 1, parse_resources(
        {"cpus": 2, "infra": "aws/us-east-1"}, "t.yaml"))


def user_with_policy(endpoint: str, name: str, document: str) -> Keys:
    iam = client("iam", endpoint, ("testing", "testing"))
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName="only", PolicyDocument=document)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def enforce(endpoint: str, after: float) -> None:
    """moto's switch: every request after the next `after` ones is checked (inf: none)."""
    urllib.request.urlopen(urllib.request.Request(
        f"{endpoint}/moto-api/reset-auth", data=str(after).encode(), method="POST",
        headers={"Content-Type": "text/plain"}),
        timeout=10).read()


@contextlib.contextmanager
def enforcement_off(endpoint: str) -> Iterator[None]:
    enforce(endpoint, float("inf"))
    try:
        yield
    finally:
        enforce(endpoint, 0)


@pytest.fixture(scope="module")
def bed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """moto enforcing IAM: an admin (for the tests' own looks), the clusterd user with
    exactly README's policy, and another account owning THEIR_BUCKET."""
    scratch = tmp_path_factory.mktemp("moto-iam")
    env = {**ubuntu_image(scratch, IMAGE), "MOTO_S3_ALLOW_CROSSACCOUNT_ACCESS": "false"}
    with moto_server(scratch, env, iam_faithful=True) as endpoint:
        make_loopback_vpc(endpoint, "us-east-1", 1)
        admin = user_with_policy(endpoint, "admin", json.dumps({
            "Version": "2012-10-17",
            "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}))
        user = user_with_policy(endpoint, "clusterd-user", README_POLICY.read_text())
        client("s3", endpoint, ("testing", "testing"), OTHER_ACCOUNT).create_bucket(
            Bucket=THEIR_BUCKET)
        enforce(endpoint, 0)
        yield {"endpoint": endpoint, "admin": admin, "user": user}


@pytest.fixture
def env(bed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return aws_environment(tmp_path, bed["endpoint"], ("ec2", "sts", "iam", "s3"),
                           monkeypatch, keys=bed["user"])


@pytest.fixture
async def provider(env: Path) -> AsyncIterator[AWSProvider]:
    config = parse(env / "config.yaml", "aws:\n  vpc_name: loopback\n  use_internal_ips: true\n")
    aws = AWSProvider(lambda: config, SSHConnections(HostKeyStore(env / "known_hosts")),
                      DaemonKey(env / "ssh"), DAEMON_ID)
    try:
        yield aws
    finally:
        await aws.aclose()


@pytest.fixture
async def buckets(env: Path) -> AsyncIterator[S3Buckets]:
    api = EC2Api(lambda: 60.0)
    try:
        yield S3Buckets(lambda region: api.client("s3", region), api.default_region)
    finally:
        await api.aclose()


def node_credentials(bed: dict[str, Any], instance: str, directory: Path) -> Path:
    """What a node's SDK gets from the instance metadata service: its profile's role's
    temporary credentials (as the bed's metadata service makes them, from STS), in a
    credentials file as the node helper reads one."""
    endpoint = bed["endpoint"]
    ec2 = client("ec2", endpoint, bed["admin"])
    association = ec2.describe_iam_instance_profile_associations(Filters=[
        {"Name": "instance-id", "Values": [instance]}])[
        "IamInstanceProfileAssociations"][0]
    name = association["IamInstanceProfile"]["Arn"].split("/")[-1]
    role = client("iam", endpoint, bed["admin"]).get_instance_profile(
        InstanceProfileName=name)["InstanceProfile"]["Roles"][0]["Arn"]
    with enforcement_off(endpoint):  # STS hands a role's keys to EC2, not to a user
        made = client("sts", endpoint, ("testing", "testing")).assume_role(
            RoleArn=role, RoleSessionName=instance)["Credentials"]
    path = directory / f"{instance}.credentials"
    path.write_text(f"[default]\naws_access_key_id = {made['AccessKeyId']}\n"
                    f"aws_secret_access_key = {made['SecretAccessKey']}\n"
                    f"aws_session_token = {made['SessionToken']}\n")
    return path


def node_copy(endpoint: str, credentials: Path, bucket: str, dest: Path) -> dict[str, Any]:
    """The node helper as the daemon runs it on a node: JSON on stdin, JSON out."""
    done = subprocess.run(
        [sys.executable, "-m", "clusterd.agent.node", "s3-copy", "-"],
        input=json.dumps({"endpoint_url": endpoint, "region": "us-east-1",
                          "credentials_file": str(credentials), "bucket": bucket,
                          "prefix": "", "dest": str(dest)}),
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    reply: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reply


async def test_clusterd_works_with_exactly_the_readme_policy(
        provider: AWSProvider, buckets: S3Buckets, bed: dict[str, Any], tmp_path: Path
) -> None:
    """Every AWS call of a cluster's life (launch, bucket made and uploaded, nodes granted it,
    stop, down, bucket deleted) passes with README's policy and nothing more."""
    assert (await provider.check())["ok"]
    source = tmp_path / "data"
    source.mkdir()
    (source / "a.txt").write_text("hello\n")
    assert await buckets.create("readme-bucket") is True
    assert (await buckets.upload_dir(str(source), "readme-bucket")).uploaded == 1
    assert await buckets.total_size("readme-bucket") == (1, 6)
    want = request("readme")
    handle = await provider.create(want, (await provider.placements(want))[0])
    try:
        assert await provider.grant_buckets(want.cloud_name, handle, ("readme-bucket",))
        credentials = node_credentials(bed, handle.nodes[0].id, tmp_path)
        reply = node_copy(bed["endpoint"], credentials, "readme-bucket", tmp_path / "copy")
        assert (tmp_path / "copy/a.txt").read_text() == "hello\n", reply
        await provider.apply_autostop(want.cloud_name, handle, True)
        await provider.stop(want.cloud_name, handle)
        assert {n.status for n in await provider.query(want.cloud_name, handle)} == {
            NodeStatus.STOPPED}
    finally:
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)
    await buckets.delete("readme-bucket")
    assert await buckets.region_of("readme-bucket") is None
    # And nothing more: what the policy does not name is refused.
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        client("iam", bed["endpoint"], bed["user"]).create_user(UserName="anyone")
    with pytest.raises(botocore.exceptions.ClientError, match="AccessDenied"):
        client("iam", bed["endpoint"], bed["user"]).create_role(
            RoleName="not-a-clusterd-role", AssumeRolePolicyDocument=json.dumps(profile.TRUST))


async def test_a_nodes_role_reaches_only_the_buckets_its_policy_names(
        provider: AWSProvider, buckets: S3Buckets, bed: dict[str, Any], tmp_path: Path
) -> None:
    for name in ("granted-bucket", "other-bucket"):
        await buckets.create(name)
    source = tmp_path / "data"
    source.mkdir()
    (source / "x.txt").write_text("x\n")
    await buckets.upload_dir(str(source), "other-bucket")
    want = request("scoped")
    handle = await provider.create(want, (await provider.placements(want))[0])
    try:
        await provider.grant_buckets(want.cloud_name, handle, ("granted-bucket",))
        credentials = node_credentials(bed, handle.nodes[0].id, tmp_path)
        assert node_copy(bed["endpoint"], credentials, "granted-bucket",
                         tmp_path / "granted").get("ok", True) is not False
        refused = node_copy(bed["endpoint"], credentials, "other-bucket", tmp_path / "other")
        assert "AccessDenied" in json.dumps(refused), refused
        assert not (tmp_path / "other/x.txt").exists()
    finally:
        await provider.terminate(want.cloud_name, handle)
        await provider.cleanup_ports(want.cloud_name, handle)
    # Its grant went with the cluster: the same credentials now reach nothing.
    gone = node_copy(bed["endpoint"], credentials, "granted-bucket", tmp_path / "after")
    assert "AccessDenied" in json.dumps(gone), gone


async def test_another_accounts_bucket_is_refused_and_said_so(buckets: S3Buckets) -> None:
    with pytest.raises(StorageError) as caught:
        await buckets.region_of(THEIR_BUCKET)
    message = caught.value.message
    assert THEIR_BUCKET in message and "another AWS account" in message, message
    assert "docs/aws-iam-policy.json" in caught.value.hint


async def test_a_teardown_does_not_need_iam_rights_when_no_bucket_was_granted(
        bed: dict[str, Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Credentials without IAM rights (a user who mounts no bucket needs none) launch and tear
    down: removing the cluster's grant is refused, said in the log, and the rest goes on."""
    policy = json.loads(README_POLICY.read_text())
    policy["Statement"] = [s for s in policy["Statement"] if s["Sid"] != "ClusterdNodeRole"]
    keys = user_with_policy_enforced(bed, "no-iam", json.dumps(policy))
    env = aws_environment(tmp_path, bed["endpoint"], ("ec2", "sts", "iam", "s3"), monkeypatch,
                          keys=keys)
    config = parse(env / "config.yaml", "aws:\n  vpc_name: loopback\n  use_internal_ips: true\n")
    aws = AWSProvider(lambda: config, SSHConnections(HostKeyStore(env / "known_hosts")),
                      DaemonKey(env / "ssh"), "clusterd-no-iam")
    want = request("no-iam")
    try:
        handle = await aws.create(want, (await aws.placements(want))[0])
        await aws.terminate(want.cloud_name, handle)
        await aws.cleanup_ports(want.cloud_name, handle)
        assert not client("ec2", bed["endpoint"], bed["admin"]).describe_security_groups(
            Filters=[{"Name": "group-name", "Values": [f"clusterd-{want.cloud_name}"]}])[
            "SecurityGroups"]
    finally:
        await aws.aclose()


def user_with_policy_enforced(bed: dict[str, Any], name: str, document: str) -> Keys:
    with enforcement_off(bed["endpoint"]):
        return user_with_policy(bed["endpoint"], name, document)
