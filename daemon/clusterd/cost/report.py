"""The cost report (`clusterctl cost-report`): the ledger's intervals of a window, per cluster
incarnation (torn-down ones too) with the split of attribution.py, per managed job with what
its recoveries cost, per provider and per UTC day, and totals. Pure: the caller gathers the
records (services/cost.py)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterd.cost.attribution import (
    JobSpan,
    Split,
    by_day,
    by_day_and_provider,
    managed_job_cost,
    split_cluster,
)
from clusterd.cost.ledger import Interval
from clusterd.cost.settled import Key, SettledSummary

OWNER_PREFIX = "managed-job:"  # as managed/store.py tags the clusters a managed job made


@dataclasses.dataclass(frozen=True)
class Window:
    since: float
    now: float


def _round(dollars: float) -> float:
    return round(dollars, 6)


def _split_view(split: Split) -> dict[str, Any]:
    return {"provisioning": _round(split.provisioning), "idle": _round(split.idle),
            "stopped": _round(split.stopped),
            "jobs": [{"job_id": job, "cost": _round(dollars)}
                     for job, dollars in sorted(split.jobs.items())]}


def _cluster_view(own: Sequence[Interval], split: Split, window: Window) -> dict[str, Any]:
    last = own[-1]
    return {
        "name": last.cluster, "incarnation": last.incarnation, "provider": last.provider,
        "infra": last.infra, "instance_type": last.instance_type, "nodes": last.nodes,
        "owner": last.owner, "started_at": own[0].started_at, "ended_at": last.ended_at,
        "live": last.ended_at is None,
        "per_hour": _round(sum(i.rate for i in own if i.ended_at is None)),
        "cost": _round(split.total), "split": _split_view(split),
        "sources": sorted({i.source for i in own}),
        # Its dollars per UTC day (the dashboard stacks them per cluster and provider).
        "days": [{"day": d, "cost": _round(c)}
                 for d, c in by_day(own, window.now, window.since).items()],
        "intervals": [{"kind": i.kind, "nodes": i.nodes, "started_at": i.started_at,
                       "ended_at": i.ended_at, "node_price_per_hour": i.node_price_per_hour,
                       "disk_price_per_hour": i.disk_price_per_hour, "source": i.source}
                      for i in own],
    }


@dataclasses.dataclass
class _Totals:
    """What every cluster of the window adds up to, listed or not."""

    split: Split = dataclasses.field(default_factory=Split)
    providers: dict[str, float] = dataclasses.field(default_factory=dict)
    attempts: dict[int, list[tuple[float, float]]] = dataclasses.field(default_factory=dict)
    count: int = 0

    def add(self, split: Split, provider: str, owner: str | None, incarnation: float) -> None:
        self.split.add(split)
        self.count += 1
        self._provider(provider, split.total)
        self._attempt(owner, incarnation, split.total)

    def add_settled(self, settled: SettledSummary) -> None:
        self.split.add(settled.split)
        self.count += settled.count
        for provider, dollars in settled.providers.items():
            self._provider(provider, dollars)
        for owner, incarnation, dollars in settled.attempts:
            self._attempt(owner, incarnation, dollars)

    def managed(self, names: dict[int, str]) -> list[dict[str, Any]]:
        managed = []
        for job_id, tried in sorted(self.attempts.items()):
            cost = managed_job_cost(tried)
            managed.append({"job_id": job_id, "name": names.get(job_id, ""),
                            "cost": _round(cost.total), "recoveries": _round(cost.recoveries),
                            "attempts": cost.attempts})
        return managed

    def _provider(self, provider: str, dollars: float) -> None:
        self.providers[provider] = self.providers.get(provider, 0.0) + dollars

    def _attempt(self, owner: str | None, incarnation: float, dollars: float) -> None:
        """A managed job's attempt (a cluster it made, `owner` tagged), if it is one."""
        if owner and owner.startswith(OWNER_PREFIX):
            self.attempts.setdefault(int(owner.removeprefix(OWNER_PREFIX)), []).append(
                (incarnation, dollars))


def build(window: Window, intervals: Sequence[Interval], up_times: dict[str, list[float]],
          jobs_of: Callable[[str, float], Sequence[JobSpan]],
          managed_names: dict[int, str], limit: int = 0,
          settled: SettledSummary | None = None,
          listed_intervals: Mapping[Key, Sequence[Interval]] | None = None,
          days: Mapping[str, Mapping[str, float]] | None = None,
          only: str = "") -> dict[str, Any]:
    """The report. `intervals`: those of the window to split here (without `settled`, all
    of them); `up_times`: per cluster name, when it became UP (sorted); `jobs_of(name,
    incarnation)`: that incarnation's jobs; `managed_names`: managed job id -> name;
    `limit`: the clusters listed, the costliest first (0: all; the rest are counted in
    `others`, and every total is over all of them); `only`: list that cluster name's
    incarnations alone (every one; the totals are still over all clusters).

    `settled` (settled.py) sums the incarnations settled with their whole life in the
    window, `listed_intervals` has the intervals of those it lists, and `days` the dollars
    per UTC day and provider of every interval in the window (Ledger.spend_by_day)."""
    incarnations: dict[Key, list[Interval]] = {}
    for interval in intervals:
        incarnations.setdefault((interval.cluster, interval.incarnation), []).append(interval)
    totals = _Totals()
    # (cost as listed, first start, intervals, split): ranked by cost, then the first started.
    rows: list[tuple[float, float, Sequence[Interval], Split]] = []
    for (name, incarnation), own in incarnations.items():
        split = split_cluster(own, up_times.get(name, []), jobs_of(name, incarnation),
                              window.now, window.since)
        totals.add(split, own[-1].provider, own[-1].owner, incarnation)
        if not only or name == only:
            rows.append((_round(split.total), own[0].started_at, own, split))
    if settled is not None:
        totals.add_settled(settled)
        own_of = listed_intervals or {}
        rows += [(_round(top.total), top.started_at, own_of[top.key], top.split)
                 for top in settled.top if top.key in own_of]
    rows.sort(key=lambda row: (-row[0], row[1]))
    listed = rows[:limit] if limit and not only else rows
    total = totals.split.total
    if days is None:
        days = by_day_and_provider(intervals, window.now, window.since)
    return {
        "since": window.since, "until": window.now,
        "total": _round(total),
        "burn_rate": _round(sum(i.rate for i in intervals if i.ended_at is None)),
        "split": _split_view(totals.split),
        "clusters": [_cluster_view(own, split, window) for _, _, own, split in listed],
        "others": {"clusters": totals.count - len(listed),
                   "cost": _round(total - sum(split.total for *_, split in listed))},
        "managed_jobs": totals.managed(managed_names),
        "providers": [{"provider": p, "cost": _round(c)}
                      for p, c in sorted(totals.providers.items())],
        "days": [{"day": d, "cost": _round(sum(p.values()))} for d, p in days.items()],
        # Every cluster's, by provider: the dashboard's chart per provider needs no listing.
        "provider_days": [{"day": d, "provider": provider, "cost": _round(c)}
                          for d, p in days.items() for provider, c in sorted(p.items())],
    }
