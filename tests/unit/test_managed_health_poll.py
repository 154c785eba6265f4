"""The pace of a managed job's health checks (clusterd.managed.poll): a poll that a broken log
stream cuts short, once per nudge."""

from __future__ import annotations

import anyio
import pytest

from clusterd.managed.poll import HealthPoll

pytestmark = pytest.mark.anyio

INTERVAL = 0.5


async def timed_wait(poll: HealthPoll) -> tuple[bool, float]:
    started = anyio.current_time()
    early = await poll.wait()
    return early, anyio.current_time() - started


async def test_without_a_nudge_it_waits_the_whole_interval() -> None:
    early, took = await timed_wait(HealthPoll(INTERVAL))
    assert not early
    assert took >= INTERVAL


async def test_a_nudge_before_the_wait_makes_it_return_at_once() -> None:
    poll = HealthPoll(INTERVAL)
    poll.look_now()
    early, took = await timed_wait(poll)
    assert early
    assert took < INTERVAL / 2


async def test_a_nudge_during_the_wait_cuts_it_short() -> None:
    poll = HealthPoll(INTERVAL)
    results: list[tuple[bool, float]] = []

    async def waiter() -> None:
        results.append(await timed_wait(poll))

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        poll.look_now()
    ((early, took),) = results
    assert early
    assert took < INTERVAL / 2


async def test_many_nudges_make_one_early_check_then_the_pace_is_the_interval() -> None:
    poll = HealthPoll(INTERVAL)
    for _ in range(5):
        poll.look_now()
    assert (await timed_wait(poll))[0]
    early, took = await timed_wait(poll)
    assert not early
    assert took >= INTERVAL
