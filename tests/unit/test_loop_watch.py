"""The event loop's lag watch (clusterd/loop_watch.py) on a real loop and a real watcher
thread: a step that does not yield shows up as lag, and is named with its stack."""

from __future__ import annotations

import time
from collections.abc import Callable

import anyio
import pytest

from clusterd.loop_watch import LoopWatch


def hold_the_loop_sleeping(seconds: float) -> None:
    time.sleep(seconds)  # the GIL is released: the watcher samples at once


def hold_the_loop_computing(seconds: float) -> None:
    end = time.monotonic() + seconds
    while time.monotonic() < end:  # the watcher gets the GIL at Python's switch interval
        pass


@pytest.mark.anyio
@pytest.mark.parametrize("hold", [hold_the_loop_sleeping, hold_the_loop_computing])
async def test_a_step_that_holds_the_loop_is_named_with_how_long(
        hold: Callable[[float], None]) -> None:
    watch = LoopWatch(period_s=0.01, held_s=0.02)
    async with anyio.create_task_group() as group:
        await group.start(watch.run)
        await anyio.sleep(0.05)
        hold(0.3)
        await anyio.sleep(0.05)
        group.cancel_scope.cancel()
    stats = watch.stats()
    assert stats["lag_ms_max"] >= 250, stats
    named = [h for h in stats["held"] if hold.__name__ in h["where"]]
    assert len(named) == 1, stats
    assert named[0]["stalls"] == 1  # one stall, sampled once however long it lasts
    assert 200 <= named[0]["longest_ms"] <= 2000, stats
    assert "test_loop_watch.py" in named[0]["where"]


@pytest.mark.anyio
async def test_lag_samples_are_kept_and_summed_up() -> None:
    watch = LoopWatch(period_s=0.01, held_s=0.02)
    async with anyio.create_task_group() as group:
        await group.start(watch.run)
        await anyio.sleep(0.2)
        group.cancel_scope.cancel()
    stats = watch.stats()
    assert stats["samples"] >= 5
    assert 0 <= stats["lag_ms_p50"] <= stats["lag_ms_p99"] <= stats["lag_ms_max"]
