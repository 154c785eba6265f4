"""Bringing objects back after a daemon restart, a few at a time.

A daemon that starts again finds every unfinished object at once (200 managed jobs whose
clusters all need a relaunch, say). Started together they would all call the cloud in the same
second, meet its rate limits and the machine's two cores together, and each go slower than if
they had queued. So each resumed driver first waits a jittered delay (spread over a window
that grows with the number of objects, capped), then takes one of `limit` slots and holds it
while it brings its object back: until its first lasting action (a watch, the object being
where it should be) or its end. New objects never wait here: only resumed ones do.
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable

import anyio

# Resumed objects brought back at once (the daemon's CLUSTERD_RESTART_LIMIT).
RESTART_LIMIT = 8
# The start of each is spread over up to this many seconds per object, capped at SPREAD_MAX_S:
# 200 jobs start within the first 30 s, 3 within 0.75 s (CLUSTERD_RESTART_SPREAD_MAX).
SPREAD_PER_OBJECT_S = 0.25
SPREAD_MAX_S = 30.0


@dataclasses.dataclass
class RestartPacer:
    limit: int = RESTART_LIMIT
    spread_per_object_s: float = SPREAD_PER_OBJECT_S
    spread_max_s: float = SPREAD_MAX_S
    rng: random.Random = dataclasses.field(default_factory=random.Random)
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep

    def __post_init__(self) -> None:
        self.slots = anyio.CapacityLimiter(self.limit)

    def delays(self, count: int) -> list[float]:
        """When each of `count` resumed objects starts, from now: uniform over the window
        (not in order: the stalest object is not always last)."""
        window = min(self.spread_max_s, count * self.spread_per_object_s)
        return [self.rng.uniform(0, window) for _ in range(count)]

    async def admit(self, delay_s: float, holder: object) -> None:
        """Wait out `delay_s`, then take a slot for `holder` (give it back with `release`)."""
        if delay_s > 0:
            await self.sleep(delay_s)
        await self.slots.acquire_on_behalf_of(holder)

    def release(self, holder: object) -> None:
        self.slots.release_on_behalf_of(holder)
