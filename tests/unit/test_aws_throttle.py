"""EC2's throttling ridden out for minutes with jittered backoff (providers/aws/throttle.py,
through EC2Api.call), on a fake clock: many tries, never FATAL after a few, a bounded total,
and each wait told."""

from __future__ import annotations

import random
from typing import Any

import pytest
from botocore.exceptions import ClientError

from clusterd.providers.aws.ec2 import EC2Api
from clusterd.providers.aws.throttle import Backoff
from clusterd.providers.base import BlockScope, ProvisionError

pytestmark = pytest.mark.anyio


def throttled() -> ClientError:
    return ClientError({"Error": {"Code": "RequestLimitExceeded",
                                  "Message": "Request limit exceeded."},
                        "ResponseMetadata": {"HTTPStatusCode": 503}}, "DescribeInstances")


class FakeClient:
    """EC2 that throttles the first `fails` calls."""

    def __init__(self, fails: int) -> None:
        self.fails = fails
        self.tries = 0

    async def describe_instances(self, **params: Any) -> dict[str, Any]:
        self.tries += 1
        if self.tries <= self.fails:
            raise throttled()
        return {"Reservations": []}


class Clock:
    def __init__(self) -> None:
        self.now = 0.0
        self.waits: list[float] = []

    async def sleep(self, seconds: float) -> None:
        self.waits.append(seconds)
        self.now += seconds


def api_with(client: FakeClient, clock: Clock, seed: int = 1) -> EC2Api:
    api = EC2Api(lambda: 30.0, Backoff(), sleep=clock.sleep, rng=random.Random(seed))
    api._clients[("ec2", "us-east-1")] = client
    return api


async def test_a_call_throttled_a_dozen_times_still_succeeds() -> None:
    clock, client = Clock(), FakeClient(fails=12)
    answer = await api_with(client, clock).call("us-east-1", "DescribeInstances")
    assert answer == {"Reservations": []}
    assert client.tries == 13
    # Growing waits (each between half and all of min(20, 2**n)), minutes in all.
    for n, wait in enumerate(clock.waits):
        ceiling = min(20.0, 2.0 ** n)
        assert ceiling / 2 <= wait <= ceiling
    assert 60 < clock.now <= 300


async def test_the_waits_are_jittered() -> None:
    one, other = Clock(), Clock()
    await api_with(FakeClient(fails=6), one, seed=1).call("us-east-1", "DescribeInstances")
    await api_with(FakeClient(fails=6), other, seed=2).call("us-east-1", "DescribeInstances")
    assert one.waits != other.waits


async def test_throttled_past_the_budget_rules_out_the_region_saying_how_long() -> None:
    clock, client = Clock(), FakeClient(fails=10_000)
    with pytest.raises(ProvisionError) as caught:
        await api_with(client, clock).call("us-east-1", "DescribeInstances")
    assert clock.now <= 300
    assert client.tries > 12
    error = caught.value
    assert error.scope == BlockScope.REGION
    assert error.message.startswith("RequestLimitExceeded: Request limit exceeded.")
    assert f"still throttled after {client.tries} tries over {clock.now:.0f} s" in error.message
    assert "request rate" in error.hint


async def test_each_wait_is_told_to_the_request_being_served() -> None:
    told: list[tuple[str, str]] = []

    async def tell(message: str, phase: str) -> None:
        told.append((phase, message))

    api = EC2Api(lambda: 30.0, Backoff(), sleep=Clock().sleep, tell=tell)
    api._clients[("ec2", "us-east-1")] = FakeClient(fails=2)
    await api.call("us-east-1", "DescribeInstances")
    assert [phase for phase, _ in told] == ["throttled", "throttled"]
    assert told[0][1].startswith("throttled by EC2 (DescribeInstances in us-east-1), "
                                 "retrying in ")
    assert told[1][1].endswith("(try 3)")
