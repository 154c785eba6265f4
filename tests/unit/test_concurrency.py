"""Background loops outlive a failing step, but not a cancellation."""

from __future__ import annotations

import errno

import anyio
import pytest
from structlog.testing import capture_logs

from clusterd.concurrency import survive


def test_a_failing_step_is_logged_and_the_loop_goes_on() -> None:
    steps: list[int] = []

    async def step() -> None:
        steps.append(len(steps))
        if len(steps) == 1:
            raise OSError(errno.EMFILE, "Too many open files")

    async def loop() -> list[bool]:
        return [await survive("refresh", step) for _ in range(3)]

    with capture_logs() as logs:
        outcomes = anyio.run(loop)
    assert outcomes == [False, True, True] and steps == [0, 1, 2]
    (failure,) = [e for e in logs if e["log_level"] == "error"]
    assert failure["step"] == "refresh" and "Too many open files" in failure["error"]


def test_cancellation_still_ends_the_loop() -> None:
    ran_after: list[bool] = []

    async def step() -> None:
        await anyio.sleep(60)

    async def main() -> None:
        with anyio.move_on_after(0.05):
            await survive("autostop", step)
            ran_after.append(True)  # never: the cancellation went through survive

    anyio.run(main)
    assert ran_after == []


def test_base_exceptions_are_not_swallowed() -> None:
    async def step() -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        anyio.run(survive, "retention", step)
