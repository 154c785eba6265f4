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


def _cluster_view(own: Sequence[Interval], split: Split) -> dict[str, Any]:
    last = own[-1]
    return {
        "name": last.cluster, "incarnation": last.incarnation, "provider": last.provider,
        "infra": last.infra, "instance_type": last.instance_type, "nodes": last.nodes,
        "owner": last.owner, "started_at": own[0].started_at, "ended_at": last.ended_at,
        "live": last.ended_at is None,
        "per_hour": _round(sum(i.rate for i in own if i.ended_at is None)),
        "cost": _round(split.total), "split": _split_view(split),
        "sources": sorted({i.source for i in own}),
        "intervals": [{"kind": i.kind, "nodes": i.nodes, "started_at": i.started_at,
                       "ended_at": i.ended_at, "node_price_per_hour": i.node_price_per_hour,
                       "disk_price_per_hour": i.disk_price_per_hour, "source": i.source}
                      for i in own],
    }


def build(window: Window, intervals: Sequence[Interval], up_times: dict[str, list[float]],
          jobs_of: Callable[[str, float], Sequence[JobSpan]],
          managed_names: dict[int, str], limit: int = 0,
          settled: SettledSummary | None = None,
          listed_intervals: Mapping[Key, Sequence[Interval]] | None = None,
          days: Mapping[str, float] | None = None) -> dict[str, Any]:
    """The report. `intervals`: those of the window to split here (without `settled`, all
    of them); `up_times`: per cluster name, when it became UP (sorted); `jobs_of(name,
    incarnation)`: that incarnation's jobs; `managed_names`: managed job id -> name;
    `limit`: the clusters listed, the costliest first (0: all; the rest are counted in
    `others`, and every total is over all of them).

    `settled` (settled.py) sums the incarnations settled with their whole life in the
    window, `listed_intervals` has the intervals of those it lists, and `days` the dollars
    per UTC day of every interval in the window (Ledger.spend_by_day)."""
    incarnations: dict[Key, list[Interval]] = {}
    for interval in intervals:
        incarnations.setdefault((interval.cluster, interval.incarnation), []).append(interval)
    total = Split()
    providers: dict[str, float] = {}
    attempts: dict[int, list[tuple[float, float]]] = {}
    # (cost as listed, first start, intervals, split): ranked by cost, then the first started.
    rows: list[tuple[float, float, Sequence[Interval], Split]] = []
    for (name, incarnation), own in incarnations.items():
        split = split_cluster(own, up_times.get(name, []), jobs_of(name, incarnation),
                              window.now, window.since)
        total.add(split)
        _add(providers, own[-1].provider, split.total)
        _attempt(attempts, own[-1].owner, incarnation, split.total)
        rows.append((_round(split.total), own[0].started_at, own, split))
    count = len(rows)
    if settled is not None:
        total.add(settled.split)
        for provider, dollars in settled.providers.items():
            _add(providers, provider, dollars)
        for owner, incarnation, dollars in settled.attempts:
            _attempt(attempts, owner, incarnation, dollars)
        own_of = listed_intervals or {}
        rows += [(_round(top.total), top.started_at, own_of[top.key], top.split)
                 for top in settled.top if top.key in own_of]
        count += settled.count
    rows.sort(key=lambda row: (-row[0], row[1]))
    listed = rows[:limit] if limit else rows
    managed = []
    for job_id, tried in sorted(attempts.items()):
        cost = managed_job_cost(tried)
        managed.append({"job_id": job_id, "name": managed_names.get(job_id, ""),
                        "cost": _round(cost.total), "recoveries": _round(cost.recoveries),
                        "attempts": cost.attempts})
    if days is None:
        days = by_day(intervals, window.now, window.since)
    return {
        "since": window.since, "until": window.now,
        "total": _round(total.total),
        "burn_rate": _round(sum(i.rate for i in intervals if i.ended_at is None)),
        "split": _split_view(total),
        "clusters": [_cluster_view(own, split) for _, _, own, split in listed],
        "others": {"clusters": count - len(listed),
                   "cost": _round(total.total - sum(split.total for *_, split in listed))},
        "managed_jobs": managed,
        "providers": [{"provider": p, "cost": _round(c)} for p, c in sorted(providers.items())],
        "days": [{"day": d, "cost": _round(c)} for d, c in days.items()],
    }


def _add(providers: dict[str, float], provider: str, dollars: float) -> None:
    providers[provider] = providers.get(provider, 0.0) + dollars


def _attempt(attempts: dict[int, list[tuple[float, float]]], owner: str | None,
             incarnation: float, dollars: float) -> None:
    """A managed job's attempt (a cluster it made, `owner` tagged), if it is one."""
    if owner and owner.startswith(OWNER_PREFIX):
        attempts.setdefault(int(owner.removeprefix(OWNER_PREFIX)), []).append(
            (incarnation, dollars))
