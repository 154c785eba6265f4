"""The EC2 test bed's ClientToken rule (scripts/_testbed/ec2/client_tokens.py), on an
in-process moto: a token answers its own reservation again, even once its instances are
terminated, and refuses other parameters, as EC2 does."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

# moto and boto3 are dev dependencies (pyproject.toml): missing, the test fails, never skips.
import boto3
import botocore.exceptions as botocore
import moto
from _testbed.ec2 import client_tokens


@pytest.fixture
def ec2(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    for key, value in (("AWS_ACCESS_KEY_ID", "testing"), ("AWS_SECRET_ACCESS_KEY", "testing"),
                       ("AWS_DEFAULT_REGION", "us-east-1"),
                       ("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")):
        monkeypatch.setenv(key, value)
    client_tokens.install()
    try:
        with moto.mock_aws():
            yield boto3.client("ec2", region_name="us-east-1")
    finally:
        client_tokens.uninstall()


def run(ec2: Any, token: str, kind: str = "t3.micro") -> dict[str, Any]:
    return ec2.run_instances(ImageId="ami-12345678", MinCount=1, MaxCount=1,  # type: ignore[no-any-return]
                             InstanceType=kind, ClientToken=token)


def test_a_token_answers_its_reservation_even_once_terminated(ec2: Any) -> None:
    first = run(ec2, "tok-1")
    (instance,) = first["Instances"]
    ec2.terminate_instances(InstanceIds=[instance["InstanceId"]])
    again = run(ec2, "tok-1")
    assert again["ReservationId"] == first["ReservationId"]
    assert [i["InstanceId"] for i in again["Instances"]] == [instance["InstanceId"]]
    listed = [i for r in ec2.describe_instances()["Reservations"] for i in r["Instances"]]
    # Nothing new was made: the one instance there is is the dead one.
    assert [(i["InstanceId"], i["State"]["Name"]) for i in listed] == [
        (instance["InstanceId"], "terminated")]
    fresh = run(ec2, "tok-2")
    assert fresh["Instances"][0]["InstanceId"] != instance["InstanceId"]


def test_a_token_with_other_parameters_is_refused(ec2: Any) -> None:
    run(ec2, "tok-1")
    with pytest.raises(botocore.ClientError) as caught:
        run(ec2, "tok-1", "t3.large")
    assert caught.value.response["Error"]["Code"] == "IdempotentParameterMismatch"


def test_a_token_longer_than_64_characters_is_refused(ec2: Any) -> None:
    with pytest.raises(botocore.ClientError) as caught:
        run(ec2, "x" * 65)
    assert caught.value.response["Error"]["Code"] == "InvalidParameterValue"
    assert run(ec2, "x" * 64)["Instances"]
