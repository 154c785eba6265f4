"""Settled splits: a torn-down cluster incarnation's cost split (attribution.py), written
once when nothing it is computed from can change any more, so that a report over thousands
of torn-down clusters sums rows in SQL instead of splitting each again over its jobs.

An incarnation is settled when every interval of it is closed, the last an hour ago or more
(SETTLE_AFTER: teardown's last copy of its jobs' logs is done), no live record is that
incarnation, and its jobs are final (its kept copy is closed out, or it has none). Its
intervals are then fixed, its UP times are in the past and its jobs' times will not change:
the split is the books closed, not a cache; it is never updated, only forgotten with its
intervals (the ledger's retention). It also outlives what it was made from: events and kept
copies have bounds of their own, and a split settled before they went keeps its jobs.

A report uses a settled split when its window covers the incarnation's whole life (the
split is over all of it); an incarnation that straddles the window's start is split anew.
Settled rows are summed in SQL (`summary`): a report reads only the rows it lists.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

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

_COVERED = "FROM cost_settled WHERE started_at >= ?"
# The order a report lists clusters in (as report.py ranks them: by cost in its rounding,
# then the first started), the first ? of them (-1: all).
_COSTLIEST = "ORDER BY ROUND(total, 6) DESC, started_at LIMIT ?"


def _listing(since: float, limit: int, only: str) -> tuple[str, list[Any]]:
    """The FROM .. LIMIT of the incarnations a report lists, and its arguments."""
    if only:
        return f"{_COVERED} AND cluster = ? {_COSTLIEST}", [since, only, -1]
    return f"{_COVERED} {_COSTLIEST}", [since, limit or -1]


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

    async def unsettled_in(self, since: float) -> list[Interval]:
        """The intervals that lasted past `since` (open ones too) of incarnations that are not
        settled with their whole life after `since`, oldest first: what a report splits."""
        rows = await self._db.fetchall(
            f"SELECT {INTERVAL_COLUMNS} FROM cost_intervals AS i"
            " WHERE (ended_at IS NULL OR ended_at > ?) AND NOT EXISTS (SELECT 1"
            "  FROM cost_settled s WHERE s.cluster = i.cluster"
            "  AND s.incarnation = i.incarnation AND s.started_at >= ?)"
            " ORDER BY started_at, id", [since, since])
        return [Interval(*row) for row in rows]

    async def listed_intervals(self, since: float, limit: int, only: str = ""
                               ) -> dict[Key, list[Interval]]:
        """Every interval of the incarnations `summary(since, limit, only)` lists, oldest
        first."""
        where, args = _listing(since, limit, only)
        rows = await self._db.fetchall(
            f"SELECT {INTERVAL_COLUMNS} FROM cost_intervals WHERE (cluster, incarnation) IN"
            f" (SELECT cluster, incarnation {where}) ORDER BY started_at, id", args)
        found: dict[Key, list[Interval]] = {}
        for row in rows:
            interval = Interval(*row)
            found.setdefault((interval.cluster, interval.incarnation), []).append(interval)
        return found

    async def settle(self, splits: Sequence[tuple[Sequence[Interval], Split]]) -> None:
        """Write each incarnation's (every interval, split) once (a second write of the same
        incarnation, from two settlings at once, changes nothing)."""
        if not splits:
            return
        await self._db.write_many(
            "INSERT OR IGNORE INTO cost_settled (cluster, incarnation, started_at, ended_at,"
            " provider, owner, total, provisioning, idle, stopped, jobs)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [(own[-1].cluster, own[-1].incarnation, own[0].started_at,
              max(i.ended_at or 0.0 for i in own), own[-1].provider, own[-1].owner,
              split.total, split.provisioning, split.idle, split.stopped, _jobs_text(split))
             for own, split in splits])

    async def summary(self, since: float, limit: int, only: str = "") -> SettledSummary:
        """What the incarnations whose whole life is after `since` add up to, summed in SQL,
        and the `limit` costliest of them (0: all) with their splits; with `only`, that
        cluster name's incarnations are listed instead (every one)."""
        where = _COVERED
        [(count, provisioning, idle, stopped)] = await self._db.fetchall(
            f"SELECT COUNT(*), TOTAL(provisioning), TOTAL(idle), TOTAL(stopped) {where}",
            [since])
        jobs = await self._db.fetchall(
            "SELECT CAST(j.key AS INTEGER), TOTAL(j.value) FROM cost_settled s,"
            " json_each(s.jobs) j WHERE s.started_at >= ? GROUP BY 1", [since])
        providers = await self._db.fetchall(
            f"SELECT provider, TOTAL(total) {where} GROUP BY provider", [since])
        attempts = await self._db.fetchall(
            f"SELECT owner, incarnation, total {where} AND owner IS NOT NULL", [since])
        listing, args = _listing(since, limit, only)
        top = await self._db.fetchall(
            "SELECT cluster, incarnation, started_at, total, provisioning, idle, stopped, jobs"
            f" {listing}", args)
        return SettledSummary(
            Split({job: dollars for job, dollars in jobs}, provisioning, idle, stopped), count,
            {provider: dollars for provider, dollars in providers},
            [(owner, incarnation, total) for owner, incarnation, total in attempts],
            [Listed((name, incarnation), started_at, total,
                    Split(_jobs_of(text), provisioning, idle, stopped))
             for name, incarnation, started_at, total, provisioning, idle, stopped, text
             in top])


@dataclasses.dataclass(frozen=True)
class Listed:
    key: Key
    started_at: float  # its first interval's start
    total: float
    split: Split


@dataclasses.dataclass(frozen=True)
class SettledSummary:
    """The settled incarnations of a report's window, summed."""

    split: Split  # all of them together
    count: int
    providers: dict[str, float]  # dollars per provider
    attempts: list[tuple[str, float, float]]  # (owner, incarnation, dollars) of owned ones
    top: list[Listed]  # the costliest, costliest first


def _jobs_text(split: Split) -> str:
    return json.dumps({str(job): dollars for job, dollars in split.jobs.items()})


def _jobs_of(text: str) -> dict[int, float]:
    return {int(job): dollars for job, dollars in json.loads(text).items()}
