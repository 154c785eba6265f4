"""What the dashboard shows of cost, gathered: `cost_report` (remembered for a few seconds per
window, so that pages open side by side, and their live updates, ask the daemon once), and
from it the cost page's view, a cluster's cost with its split, and a managed job's cost with
its recoveries' and each attempt's."""

from __future__ import annotations

import asyncio
import math
import time
from typing import Any

from clusterctl import protocol
from clusterctl.client import ClusterdError

from ._costcharts import (
    by_cluster,
    by_provider,
    split_parts,
    stacked_days,
    unlisted_days,
    window_days,
)
from ._daemon import DaemonLink

DAY_S = 86400.0
MAX_DAYS = 3650  # as the daemon allows
DEFAULT_DAYS = 30
REPORT_MAX_AGE_S = 5.0
REPORTS_HELD = 8  # reports remembered (windows, and clusters asked alone)
SPENDERS_SHOWN = 20
# The cost page lists the costliest 100 (the op's default); the rest come as totals: a
# report of every cluster could pass the frame limit (about 13,000 clusters).
PAGE_LISTED = 100
JOBS_SHOWN = 10
# The windows a cluster's or a job's page asks for: few, so their reports are shared.
WINDOWS = (7, 30, 90, 365, MAX_DAYS)
OWNER_PREFIX = "managed-job:"  # the owner tag of a managed job's clusters


class ReportCache:
    """`cost_report` per window (the cost page's: the costliest clusters) or per window and
    cluster (a cluster's or a job's page: that cluster's incarnations), each at most
    `max_age_s` old; the `REPORTS_HELD` asked last are remembered."""

    def __init__(self, link: DaemonLink, max_age_s: float = REPORT_MAX_AGE_S) -> None:
        self._link = link
        self._max_age_s = max_age_s
        self._reports: dict[tuple[int, str], tuple[float, dict[str, Any]]] = {}
        self._lock = asyncio.Lock()

    async def get(self, days: int, cluster: str = "") -> dict[str, Any]:
        key = (days, cluster)
        async with self._lock:  # one report at a time: a page's parts ask together
            held = self._reports.get(key)
            if held is not None and time.monotonic() - held[0] <= self._max_age_s:
                return held[1]
            report = await self._link.call(protocol.CostReportArgs(
                days=days, limit=PAGE_LISTED, cluster=cluster))
            self._reports.pop(key, None)
            self._reports[key] = (time.monotonic(), report)
            while len(self._reports) > REPORTS_HELD:  # the oldest fetched goes first
                del self._reports[next(iter(self._reports))]
            return report


def days_asked(text: str | None) -> int:
    """The cost page's `?days=N` (1 to the daemon's limit); 30 if absent or not a number."""
    try:
        days = int(text or DEFAULT_DAYS)
    except ValueError:
        return DEFAULT_DAYS
    return min(MAX_DAYS, max(1, days))


def covering(since: float | None, now: float | None = None) -> int:
    """The smallest window of WINDOWS that reaches back a day before `since` (a launch's
    nodes start before it is UP)."""
    now = time.time() if now is None else now
    needed = math.ceil((now - (since or now)) / DAY_S) + 1
    return next((w for w in WINDOWS if w >= needed), MAX_DAYS)


def page_view(report: dict[str, Any]) -> dict[str, Any]:
    """The cost page's values: the two charts with their legends, the spenders, idle's
    share, the burn rate and the budgets."""
    clusters = report.get("clusters") or []
    unlisted = int((report.get("others") or {}).get("clusters") or 0)
    days = window_days(float(report["since"]), float(report["until"]))
    providers = by_provider(report.get("provider_days") or [])
    names = by_cluster(clusters, unlisted=unlisted_days(report.get("days") or [], clusters),
                       unlisted_count=unlisted)
    split = report.get("split") or {}
    total = float(report.get("total") or 0.0)
    managed = sorted(report.get("managed_jobs") or [], key=lambda j: -float(j["cost"]))
    return {
        "total": total, "burn_rate": float(report.get("burn_rate") or 0.0),
        "idle": float(split.get("idle") or 0.0), "parts": split_parts(split),
        "by_provider": stacked_days(days, providers, "spend per day by provider"),
        "by_cluster": stacked_days(days, names, "spend per day by cluster"),
        "provider_keys": providers, "cluster_keys": names,
        "clusters": clusters[:SPENDERS_SHOWN],
        "more_clusters": max(0, len(clusters) - SPENDERS_SHOWN) + unlisted,
        "managed": managed[:SPENDERS_SHOWN], "more_managed": max(0, len(managed)
                                                                 - SPENDERS_SHOWN),
        "budgets": report.get("budgets") or [],
    }


async def cluster_cost(cache: ReportCache, name: str, launched_at: float | None
                       ) -> dict[str, Any]:
    """The cluster's running incarnation in the report (its $/h, cost so far and split), or
    why there is none to show."""
    try:
        report = await cache.get(covering(launched_at), name)
    except ClusterdError as exc:
        return {"entry": None, "error": _unanswered(exc)}
    entry = next((c for c in report.get("clusters") or []
                  if c["name"] == name and c["live"]), None)
    jobs = sorted((entry or {}).get("split", {}).get("jobs") or [],
                  key=lambda j: -float(j["cost"]))
    return {"entry": entry, "jobs": jobs[:JOBS_SHOWN], "more_jobs": max(0, len(jobs)
                                                                       - JOBS_SHOWN),
            "error": "" if entry else "nothing in the cost ledger for it yet"}


async def managed_cost(cache: ReportCache, job: dict[str, Any]) -> dict[str, Any]:
    """A managed job's cost so far (its record's, as `jobs queue` says it), what its
    recoveries cost, and each attempt's cluster's cost (oldest first)."""
    try:
        report = await cache.get(covering(job.get("submitted_at")), str(job.get("cluster") or ""))
    except ClusterdError as exc:
        return {"cost": job.get("cost"), "entry": None, "attempts": [],
                "error": _unanswered(exc)}
    entry = next((j for j in report.get("managed_jobs") or []
                  if j["job_id"] == job["job_id"]), None)
    owner = f"{OWNER_PREFIX}{job['job_id']}"
    attempts = sorted((c for c in report.get("clusters") or [] if c.get("owner") == owner),
                      key=lambda c: float(c["incarnation"]))
    cost = job.get("cost")
    if cost is None and entry is not None:  # a daemon whose queue does not say it
        cost = entry["cost"]
    return {"cost": cost, "entry": entry, "attempts": attempts, "error": ""}


def _unanswered(error: ClusterdError) -> str:
    if error.code == protocol.ErrorCode.UNKNOWN_OP:
        return "this clusterd keeps no cost ledger (upgrade it)"
    return f"{error.message} [{error.code}]"


async def job_cost(cache: ReportCache, cluster: str, job: dict[str, Any]) -> dict[str, Any]:
    """A job's share of its cluster's cost (by the time it held nodes: k of n nodes, k/n),
    beside the cluster's cost so far."""
    found = await cluster_cost(cache, cluster, job.get("submitted_at"))
    entry = found["entry"]
    if entry is None:
        return {"cost": None, "of": None, "error": found["error"]}
    share = next((float(j["cost"]) for j in entry["split"].get("jobs") or []
                  if j["job_id"] == job["job_id"]), None)
    return {"cost": share, "of": entry["cost"],
            "error": "" if share is not None else "nothing counted for it yet"}
