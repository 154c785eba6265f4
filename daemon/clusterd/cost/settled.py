"""Settled splits: a torn-down cluster incarnation's cost split (attribution.py), written
once when nothing it is computed from can change any more, so that a report over thousands
of torn-down clusters reads one row each instead of splitting each again over its jobs.

An incarnation is settled when every interval of it is closed, the last an hour ago or more
(SETTLE_AFTER: teardown's last copy of its jobs' logs is done), no live record is that
incarnation, and its jobs are final (its kept copy is closed out, or it has none). Its
intervals are then fixed, its UP times are in the past and its jobs' times will not change:
the split is the books closed, not a cache; it is never updated, only forgotten with its
intervals (the ledger's retention). It also outlives what it was made from: events and kept
copies have bounds of their own, and a split settled before they went keeps its jobs.

A report uses a settled split when its window covers the incarnation's whole life (the
split is over all of it); an incarnation that straddles the window's start is split anew.
"""

from __future__ import annotations

import json
from collections.abc import Sequence

from clusterd.cost.attribution import Split
from clusterd.cost.ledger import INTERVAL_COLUMNS, Interval
from clusterd.state.db import Database

SETTLE_AFTER = 3600.0
Key = tuple[str, float]  # (cluster, incarnation)

# Incarnations all of whose intervals closed before ?, neither live nor settled yet.
_UNSETTLED = (
    "SELECT cluster, incarnation FROM cost_intervals AS i"
    " WHERE NOT EXISTS (SELECT 1 FROM cost_settled s"
    "  WHERE s.cluster = i.cluster AND s.incarnation = i.incarnation)"
    " AND NOT EXISTS (SELECT 1 FROM clusters c"
    "  WHERE c.name = i.cluster AND c.created_at = i.incarnation)"
    " GROUP BY cluster, incarnation"
    " HAVING COUNT(ended_at) = COUNT(*) AND MAX(ended_at) < ?")


class SettledSplits:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def unsettled(self, before: float) -> dict[Key, list[Interval]]:
        """Incarnations that may be settled now (all intervals closed before `before`), with
        every interval of each, oldest first."""
        rows = await self._db.fetchall(
            f"SELECT {INTERVAL_COLUMNS} FROM cost_intervals"
            f" WHERE (cluster, incarnation) IN ({_UNSETTLED}) ORDER BY started_at, id",
            [before])
        found: dict[Key, list[Interval]] = {}
        for row in rows:
            interval = Interval(*row)
            found.setdefault((interval.cluster, interval.incarnation), []).append(interval)
        return found

    async def settle(self, splits: Sequence[tuple[Key, float, float, Split]]) -> None:
        """Write each (key, first start, last end, split) once (a second write of the same
        incarnation, from two reports at once, changes nothing)."""
        if not splits:
            return
        await self._db.write_many(
            "INSERT OR IGNORE INTO cost_settled (cluster, incarnation, started_at, ended_at,"
            " provisioning, idle, stopped, jobs) VALUES (?, ?, ?, ?, ?, ?, ?, ?)",
            [(name, incarnation, started, ended, split.provisioning, split.idle,
              split.stopped, json.dumps({str(job): dollars for job, dollars in split.jobs.items()}))
             for (name, incarnation), started, ended, split in splits])

    async def covered(self, since: float) -> dict[Key, Split]:
        """The settled splits of incarnations whose whole life is after `since`."""
        rows = await self._db.fetchall(
            "SELECT cluster, incarnation, provisioning, idle, stopped, jobs FROM cost_settled"
            " WHERE started_at >= ?", [since])
        return {(name, incarnation): Split({int(job): dollars
                                            for job, dollars in json.loads(jobs).items()},
                                           provisioning, idle, stopped)
                for name, incarnation, provisioning, idle, stopped, jobs in rows}
