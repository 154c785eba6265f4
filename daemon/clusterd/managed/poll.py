"""The pace of a managed job's health checks: a poll every few seconds, cut short when
something else (the job's log stream breaking) says the cluster may be gone."""

from __future__ import annotations

import anyio


class HealthPoll:
    """`wait()` returns after `interval_s`, or at once when `look_now()` was called since the
    previous wait returned (also while it waits). It says which: True when cut short."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._nudged = anyio.Event()

    def look_now(self) -> None:
        """Ask for the next check now. Never blocks; any number of calls make one check."""
        self._nudged.set()

    async def wait(self) -> bool:
        with anyio.move_on_after(self.interval_s):
            await self._nudged.wait()
        early = self._nudged.is_set()
        self._nudged = anyio.Event()
        return early
