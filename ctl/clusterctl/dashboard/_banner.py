"""The budget banner on every page: the daemon's notices (its hello's `alerts`: a budget
past its `warn_at` (warn), or exceeded (error), with its spend and projection; a cluster idle
with no autostop), looked at every few seconds on a connection of their own, and published
for pages and their live streams."""

from __future__ import annotations

import asyncio

from clusterctl.client import ClusterdError
from clusterctl.protocol import Notice

from ._daemon import Broadcast, DaemonLink

# The daemon's budget controller looks at each budget every 30 s: a look at its notices every
# 5 s shows a change within seconds of it, for one short connection each time.
NOTICES_POLL_S = 5.0


class BudgetBanner:
    def __init__(self, link: DaemonLink, interval_s: float = NOTICES_POLL_S) -> None:
        self._link = link
        self._interval_s = interval_s
        self.lines: Broadcast[tuple[Notice, ...]] = Broadcast(())

    async def look(self) -> tuple[Notice, ...]:
        """The notices now (published if they changed); as they were if clusterd does not
        answer (the health line says so)."""
        try:
            lines = tuple(await self._link.notices())
        except ClusterdError:
            return self.lines.value
        if lines != self.lines.value:
            self.lines.publish(lines)
        return lines

    async def run(self) -> None:
        while True:
            await self.look()
            await asyncio.sleep(self._interval_s)
