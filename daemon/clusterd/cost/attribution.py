"""Who a cluster's cost was for: its jobs, by the time they held its nodes, and the rest
named (provisioning and setup, idle, stopped disks); and a managed job's cost over its
attempts, naming what its recoveries cost. Pure functions over records: no I/O.

A cluster's running interval is split at the time the cluster was first UP in it: before,
provisioning and setup; after, each moment's cost goes to the jobs running then, a job on
k of n nodes taking k/n, and what no job held is idle. Jobs that together claim more than
every node (Ray lets jobs share nodes) share the moment in proportion to their claims.
"""

from __future__ import annotations

import bisect
import dataclasses
from collections.abc import Iterable, Sequence

from clusterd.cost.ledger import RUNNING, Interval, utc_date

_DAY = 86400.0


@dataclasses.dataclass(frozen=True)
class JobSpan:
    """One job of the cluster's queue (its agent's), as far as cost is concerned."""

    job_id: int
    started_at: float | None  # None: it never ran
    ended_at: float | None  # None: it runs still
    nodes: int = 1


@dataclasses.dataclass
class Split:
    """Dollars, by what they paid for."""

    jobs: dict[int, float] = dataclasses.field(default_factory=dict)
    provisioning: float = 0.0  # nodes running before the cluster was UP (setup included)
    idle: float = 0.0  # UP, no job holding the nodes
    stopped: float = 0.0  # disks of stopped nodes

    @property
    def total(self) -> float:
        return sum(self.jobs.values()) + self.provisioning + self.idle + self.stopped

    def add(self, other: Split) -> None:
        for job, dollars in other.jobs.items():
            self.jobs[job] = self.jobs.get(job, 0.0) + dollars
        self.provisioning += other.provisioning
        self.idle += other.idle
        self.stopped += other.stopped


def split_cluster(intervals: Iterable[Interval], up_times: Sequence[float],
                  jobs: Sequence[JobSpan], now: float, since: float = 0.0) -> Split:
    """One cluster incarnation's cost from `since` to `now`, split. `up_times`: when it
    became UP (sorted), from its events."""
    split = Split()
    for interval in intervals:
        end = interval.ended_at if interval.ended_at is not None else now
        if interval.kind != RUNNING:
            split.stopped += interval.cost(now, since)
            continue
        at = bisect.bisect_left(up_times, interval.started_at)
        up_at = min(up_times[at], end) if at < len(up_times) else end
        rate = interval.rate / 3600
        split.provisioning += rate * _overlap(interval.started_at, up_at, since, end)
        _share_out(split, max(up_at, since), end, interval.nodes, rate, jobs, now)
    return split


def _overlap(start: float, end: float, since: float, until: float) -> float:
    return max(0.0, min(end, until) - max(start, since))


def _share_out(split: Split, start: float, end: float, nodes: int, rate: float,
               jobs: Sequence[JobSpan], now: float) -> None:
    """[start, end) at `rate` dollars a second, over the jobs that ran then, and idle.

    One sweep over the jobs' starts and ends (a report splits thousands of clusters): between
    two consecutive edges the same jobs run."""
    if end <= start:
        return
    edges: dict[float, list[tuple[bool, JobSpan]]] = {start: [], end: []}
    for job in jobs:
        if job.started_at is None:
            continue
        began = max(job.started_at, start)
        ended = min(job.ended_at if job.ended_at is not None else now, end)
        if ended > began:
            edges.setdefault(began, []).append((True, job))
            edges.setdefault(ended, []).append((False, job))
    claims: dict[int, float] = {}  # the jobs running now: each one's share of the nodes
    left = start
    for at in sorted(edges):
        if at > left:
            _segment(split, claims, rate * (at - left))
        for begins, job in edges[at]:
            if begins:
                claims[job.job_id] = min(job.nodes, nodes) / max(nodes, 1)
            else:
                claims.pop(job.job_id, None)
        left = at


def _segment(split: Split, claims: dict[int, float], dollars: float) -> None:
    """`dollars` over the jobs running (in proportion if they claim more than every node),
    the unclaimed rest idle."""
    claimed = sum(claims.values())
    scale = 1.0 / claimed if claimed > 1 else 1.0
    for job_id, claim in claims.items():
        split.jobs[job_id] = split.jobs.get(job_id, 0.0) + dollars * claim * scale
    split.idle += dollars * max(0.0, 1.0 - claimed)


@dataclasses.dataclass(frozen=True)
class ManagedCost:
    total: float
    recoveries: float  # what the attempts before the last cost (time on preempted ones)
    attempts: int


def managed_job_cost(attempts: Sequence[tuple[float, float]]) -> ManagedCost:
    """A managed job's cost from its attempts' clusters: (incarnation, dollars) each; every
    attempt but the newest was lost (preempted, failed) and recovered from."""
    ordered = sorted(attempts)
    total = sum(dollars for _, dollars in ordered)
    recoveries = sum(dollars for _, dollars in ordered[:-1])
    return ManagedCost(total, recoveries, len(ordered))


def by_day_and_provider(intervals: Iterable[Interval], now: float, since: float = 0.0
                        ) -> dict[str, dict[str, float]]:
    """Dollars per UTC day (YYYY-MM-DD) and provider, each interval cut at midnights (a UTC
    day is 86,400 seconds of POSIX time, so days are counted by division).
    Ledger.spend_by_day is the same sum in SQL."""
    per_day: dict[int, dict[str, float]] = {}
    for interval in intervals:
        start = max(interval.started_at, since)
        end = interval.ended_at if interval.ended_at is not None else now
        rate = interval.rate / 3600
        while start < end:
            day = int(start // _DAY)
            piece_end = min(end, (day + 1) * _DAY)
            providers = per_day.setdefault(day, {})
            providers[interval.provider] = (providers.get(interval.provider, 0.0)
                                            + rate * (piece_end - start))
            start = piece_end
    return {utc_date(day): providers for day, providers in sorted(per_day.items())}


def by_day(intervals: Iterable[Interval], now: float, since: float = 0.0) -> dict[str, float]:
    """Dollars per UTC day (YYYY-MM-DD), over every provider."""
    return {day: sum(providers.values())
            for day, providers in by_day_and_provider(intervals, now, since).items()}
