"""The cost report (`clusterctl cost-report`): the ledger's intervals of a window, per cluster
incarnation (torn-down ones too) with the split of attribution.py, per managed job with what
its recoveries cost, per provider and per UTC day, and totals. Pure: the caller gathers the
records (services/cost.py)."""

from __future__ import annotations

import dataclasses
import heapq
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from clusterd.cost.attribution import JobSpan, Split, by_day, managed_job_cost, split_cluster
from clusterd.cost.ledger import Interval

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
          managed_names: dict[int, str],
          settled: Mapping[tuple[str, float], Split] | None = None,
          limit: int = 0) -> dict[str, Any]:
    """The report. `up_times`: per cluster name, when it became UP (sorted); `jobs_of(name,
    incarnation)`: that incarnation's jobs; `managed_names`: managed job id -> name;
    `settled`: the splits of incarnations whose whole life is in the window, settled
    (settled.py), used as they are; `limit`: the clusters listed, the costliest first (0:
    all; the rest are counted in `others`, and every total is over all of them)."""
    settled = settled or {}
    incarnations: dict[tuple[str, float], list[Interval]] = {}
    for interval in intervals:
        incarnations.setdefault((interval.cluster, interval.incarnation), []).append(interval)
    splits: list[tuple[float, list[Interval], Split]] = []
    total = Split()
    providers: dict[str, float] = {}
    attempts: dict[int, list[tuple[float, float]]] = {}
    for (name, incarnation), own in incarnations.items():
        split = settled.get((name, incarnation)) or split_cluster(
            own, up_times.get(name, []), jobs_of(name, incarnation), window.now, window.since)
        total.add(split)
        last = own[-1]
        providers[last.provider] = providers.get(last.provider, 0.0) + split.total
        if last.owner and last.owner.startswith(OWNER_PREFIX):
            job_id = int(last.owner.removeprefix(OWNER_PREFIX))
            attempts.setdefault(job_id, []).append((incarnation, split.total))
        splits.append((_round(split.total), own, split))
    # Only the listed clusters are drawn up (a report may span thousands): nlargest is
    # sorted()[:limit], ties in the order they came.
    listed = (heapq.nlargest(limit, splits, key=lambda row: row[0]) if limit
              else sorted(splits, key=lambda row: row[0], reverse=True))
    managed = []
    for job_id, tried in sorted(attempts.items()):
        cost = managed_job_cost(tried)
        managed.append({"job_id": job_id, "name": managed_names.get(job_id, ""),
                        "cost": _round(cost.total), "recoveries": _round(cost.recoveries),
                        "attempts": cost.attempts})
    return {
        "since": window.since, "until": window.now,
        "total": _round(total.total),
        "burn_rate": _round(sum(i.rate for i in intervals if i.ended_at is None)),
        "split": _split_view(total),
        "clusters": [_cluster_view(own, split) for _, own, split in listed],
        "others": {"clusters": len(splits) - len(listed),
                   "cost": _round(total.total - sum(split.total for _, _, split in listed))},
        "managed_jobs": managed,
        "providers": [{"provider": p, "cost": _round(c)} for p, c in sorted(providers.items())],
        "days": [{"day": d, "cost": _round(c)}
                 for d, c in by_day(intervals, window.now, window.since).items()],
    }
