"""The controller engine (clusterd.control) with a toy controller on an in-memory record:
the loop of intent, observe, step and act; resume from the record alone; the object's lock;
a cancel's settle; bounded, jittered resumes; retry gaps under throttling. All in
milliseconds (the pacer's sleep is the test's)."""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Mapping

import anyio
import anyio.lowlevel
import pytest
from botocore.exceptions import ClientError

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.control import Action, Controller, Engine, RestartPacer, RetryGaps, is_throttling
from clusterd.providers.aws import errors as aws_errors
from clusterd.providers.aws.throttle import Backoff
from clusterd.providers.base import ProvisionError
from clusterd.provision.failover import Attempt
from clusterd.provision.launcher import NoPlacement

pytestmark = pytest.mark.anyio


@dataclasses.dataclass(frozen=True)
class Work(Action):
    name: str


@dataclasses.dataclass(frozen=True)
class Hold(Action):
    lasting = True


Intent = tuple[str, tuple[str, ...]]  # (the object, its work to do)


class Toy(Controller[str, Intent, int]):
    """An object's record is the work still to do; each action is recorded done once it is."""

    def __init__(self, records: Mapping[str, tuple[str, ...]]) -> None:
        self.records = dict(records)
        self.done: list[tuple[str, str]] = []
        self.gate = anyio.Event()  # what Work waits for, when `gated`
        self.gated = False
        self.settle_gate: anyio.Event | None = None
        self.acting = 0
        self.most_acting = 0
        self.inside: dict[str, int] = {}  # drivers in a step or settle, per object
        self.failures: list[tuple[str, str]] = []
        self.settled: list[str] = []

    def intent(self, key: str) -> Intent | None:
        work = self.records.get(key)
        return (key, work) if work else None

    async def observe(self, intent: Intent) -> int:
        return len(intent[1])

    def step(self, intent: Intent, observed: int) -> Action | None:
        first = intent[1][0]
        return Hold() if first == "hold" else Work(first)

    async def act(self, intent: Intent, action: Action) -> None:
        key, work = intent
        self.inside[key] = self.inside.get(key, 0) + 1
        assert self.inside[key] == 1, "two drivers at once"
        try:
            if isinstance(action, Hold):
                await anyio.sleep_forever()
            assert isinstance(action, Work)
            if action.name == "boom":
                raise RuntimeError("a bug")
            self.acting += 1
            self.most_acting = max(self.most_acting, self.acting)
            try:
                if self.gated:
                    await self.gate.wait()
            finally:
                self.acting -= 1
            self.done.append((key, action.name))
            self.records[key] = work[1:]
        finally:
            self.inside[key] -= 1

    async def failed(self, key: str, error: Exception) -> None:
        self.failures.append((key, str(error)))
        self.records[key] = ()

    async def settle(self, key: str) -> None:
        self.inside[key] = self.inside.get(key, 0) + 1
        try:
            self.settled.append(key)
            if self.settle_gate is not None:
                await self.settle_gate.wait()
        finally:
            self.inside[key] -= 1


def quick_pacer(limit: int = 8, waits: list[float] | None = None) -> RestartPacer:
    async def sleep(seconds: float) -> None:
        if waits is not None:
            waits.append(seconds)
        await anyio.lowlevel.checkpoint()

    return RestartPacer(limit=limit, rng=random.Random(1), sleep=sleep)


async def settled(toy: Toy, engine: Engine[str, Intent, int], *keys: str) -> None:
    with anyio.fail_after(5):
        while any(engine.driving(k) for k in keys) or len(toy.settled) < len(keys):
            await anyio.sleep(0.001)


async def test_a_driver_steps_until_its_intent_is_met_then_settles() -> None:
    toy = Toy({"a": ("make", "start"), "b": ()})
    engine = Engine(toy, "toy", quick_pacer())
    assert not engine.spawn("a")  # not running yet
    async with anyio.create_task_group() as group:
        await group.start(engine.run, ["a", "b"])
        await settled(toy, engine, "a", "b")
        group.cancel_scope.cancel()
    assert toy.done == [("a", "make"), ("a", "start")]
    assert sorted(toy.settled) == ["a", "b"]


async def test_a_killed_daemon_resumes_from_the_record_alone() -> None:
    records = {"a": ("make", "start", "watch")}
    first = Toy(records)
    first.gated = True
    async with anyio.create_task_group() as group:
        await group.start(Engine(first, "toy", quick_pacer()).run, ["a"])
        with anyio.fail_after(5):
            while first.acting == 0:
                await anyio.sleep(0.001)
        group.cancel_scope.cancel()  # kill -9 in the middle of "make"
    assert first.done == [] and first.records["a"] == ("make", "start", "watch")
    # A new daemon: a new controller and engine, and only the records.
    second = Toy(first.records)
    engine = Engine(second, "toy", quick_pacer())
    async with anyio.create_task_group() as group:
        await group.start(engine.run, list(records))
        await settled(second, engine, "a")
        group.cancel_scope.cancel()
    assert second.done == [("a", "make"), ("a", "start"), ("a", "watch")]


async def test_a_driver_spawned_while_the_last_settles_waits_for_the_objects_lock() -> None:
    toy = Toy({"a": ("make",)})
    toy.settle_gate = anyio.Event()
    engine = Engine(toy, "toy", quick_pacer())
    async with anyio.create_task_group() as group:
        await group.start(engine.run, [])
        assert engine.spawn("a")
        with anyio.fail_after(5):
            while not toy.settled:
                await anyio.sleep(0.001)
        toy.records["a"] = ("again",)  # wanted again while the last driver settles
        assert engine.spawn("a")
        await anyio.wait_all_tasks_blocked()
        assert toy.done == [("a", "make")], "the new driver ran beside the settling one"
        toy.settle_gate.set()
        with anyio.fail_after(5):
            while len(toy.settled) < 2:
                await anyio.sleep(0.001)
        group.cancel_scope.cancel()
    assert toy.done == [("a", "make"), ("a", "again")]


async def test_cancel_calls_the_driver_off_and_settle_still_runs() -> None:
    toy = Toy({"a": ("hold",)})
    engine = Engine(toy, "toy", quick_pacer())
    async with anyio.create_task_group() as group:
        await group.start(engine.run, [])
        engine.spawn("a")
        await anyio.wait_all_tasks_blocked()
        assert engine.driving("a") and not toy.settled
        assert engine.cancel("a")
        await settled(toy, engine, "a")
        assert not engine.cancel("a")
        group.cancel_scope.cancel()
    assert toy.settled == ["a"]


async def test_a_bug_in_a_step_ends_that_object_only() -> None:
    toy = Toy({"a": ("boom", "never"), "b": ("fine",)})
    engine = Engine(toy, "toy", quick_pacer())
    async with anyio.create_task_group() as group:
        await group.start(engine.run, ["a", "b"])
        await settled(toy, engine, "a", "b")
        group.cancel_scope.cancel()
    assert toy.failures == [("a", "a bug")]
    assert toy.done == [("b", "fine")]


async def test_resumed_objects_are_brought_back_a_few_at_a_time() -> None:
    # 12 to bring back (each a piece of work), 5 already where they should be (a watch).
    records = {f"w{i}": ("relaunch",) for i in range(12)}
    records.update({f"h{i}": ("hold",) for i in range(5)})
    toy = Toy(records)
    toy.gated = True
    waits: list[float] = []
    engine = Engine(toy, "toy", quick_pacer(limit=3, waits=waits))
    async with anyio.create_task_group() as group:
        await group.start(engine.run, list(records))
        await anyio.wait_all_tasks_blocked()
        # The watching ones hold no slot: three relaunch at once, the rest wait.
        assert toy.acting == 3
        toy.gate.set()
        with anyio.fail_after(5):
            while len(toy.done) < 12:
                await anyio.sleep(0.001)
        # New work is not paced, and is not held up by the resumed ones.
        toy.records["new"] = ("make",)
        engine.spawn("new")
        with anyio.fail_after(5):
            while len(toy.done) < 13:
                await anyio.sleep(0.001)
        group.cancel_scope.cancel()
    assert toy.most_acting == 3
    assert len(waits) == 17, "every resumed object waits its jitter"


def test_resume_delays_are_jittered_over_a_window_that_grows_then_stops() -> None:
    pacer = RestartPacer(rng=random.Random(3))
    few = pacer.delays(3)
    assert all(0 <= d <= 3 * pacer.spread_per_object_s for d in few)
    many = pacer.delays(200)
    assert all(0 <= d <= pacer.spread_max_s for d in many)
    assert max(many) > pacer.spread_max_s * 0.9 and min(many) < pacer.spread_max_s * 0.1
    assert len(set(many)) == 200


def test_retry_gaps_grow_to_their_cap() -> None:
    gaps = RetryGaps(10, 30)
    assert [gaps.next() for _ in range(5)] == [10, 15, 22.5, 30, 30]


def test_throttled_failures_wait_at_least_a_jittered_exponential_backoff() -> None:
    backoff = Backoff(base_s=20, cap_s=300)
    seen = []
    for seed in range(20):
        gaps = RetryGaps(1, 5, throttle=backoff, rng=random.Random(seed))
        waits = [gaps.next(throttled=True) for _ in range(4)]
        # Each within "equal jitter" of its ceiling, 20, 40, 80, 160.
        for n, wait in enumerate(waits):
            ceiling = min(300, 20 * 2 ** n)
            assert ceiling / 2 <= wait <= ceiling
        seen.append(waits[0])
    assert len(set(seen)) > 10, "controllers throttled together must not retry together"


def _aws_refusal(code: str) -> ProvisionError:
    return aws_errors.classify(ClientError({"Error": {"Code": code, "Message": "no"},
                                            "ResponseMetadata": {"HTTPStatusCode": 503}},
                                           "RunInstances"), "aws/us-east-1")


def _attempt(error: ProvisionError) -> Attempt:
    return Attempt("aws/us-east-1", "m5.large", error.message, str(error.scope),
                   throttled=error.throttled)


def test_throttling_is_told_by_the_providers_error_not_by_its_text() -> None:
    throttled, no_capacity = _aws_refusal("RequestLimitExceeded"), _aws_refusal(
        "InsufficientInstanceCapacity")
    assert is_throttling(throttled) and not is_throttling(no_capacity)
    # Failover's summary carries it when any place refused for the rate, not for capacity.
    assert is_throttling(NoPlacement("c", [_attempt(no_capacity), _attempt(throttled)]))
    assert not is_throttling(NoPlacement("c", [_attempt(no_capacity)]))
    # A message that only names the code (a task's echo, a user's cluster name) is not one.
    assert not is_throttling(ProtocolError(ErrorCode.RESOURCES_UNAVAILABLE,
                                           "no place: us-east-1: RequestLimitExceeded"))


async def test_wake_ends_every_pause_at_once_and_only_those_under_way() -> None:
    engine = Engine(Toy({}), "toy", quick_pacer())
    engine.wake()  # nobody pausing: nothing to end, and no later pause is cut short
    ended: list[str] = []

    async def pause(name: str) -> None:
        await engine.pause(3600)
        ended.append(name)

    with anyio.fail_after(5):
        async with anyio.create_task_group() as group:
            group.start_soon(pause, "a")
            group.start_soon(pause, "b")
            await anyio.wait_all_tasks_blocked()
            assert ended == []
            engine.wake()
        assert sorted(ended) == ["a", "b"]
        with anyio.move_on_after(0.05) as waited:  # a new pause waits for its own wake
            await engine.pause(3600)
        assert waited.cancelled_caught
