"""`cost_report`: the records the report needs (the ledger's intervals, when each cluster
became UP, each incarnation's jobs as the kept copies last saw them, managed jobs' names),
gathered for cost/report.py; the settling of torn-down incarnations' splits
(cost/settled.py), done before each report and hourly, so that a report splits only what
is still live or straddles its window's start; and each configured budget's month so far
(spent, the burn rate, its recorded level, the projection), so a page can show it while it
is still clear."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

import anyio

from clusterd.cost.attribution import JobSpan, split_cluster
from clusterd.cost.budget import Budget, BudgetState, Level, level_in, measure, projection
from clusterd.cost.ledger import Ledger
from clusterd.cost.report import Window, build
from clusterd.cost.settled import SETTLE_AFTER, Key, SettledSplits
from clusterd.keptlogs.store import KeptCluster, KeptLogStore
from clusterd.managed.store import ManagedJobRecord, ManagedJobStore
from clusterd.state.db import Database

DAY = 86400.0


class CostService:
    def __init__(self, ledger: Ledger, db: Database, kept: KeptLogStore | None,
                 managed: ManagedJobStore,
                 budgets: Callable[[], tuple[Budget, ...]] = tuple,
                 budget_state: Callable[[str, str], BudgetState] | None = None) -> None:
        self.ledger = ledger
        self._db = db
        self._kept = kept
        self._managed = managed
        self._budgets = budgets
        # A budget's recorded state by (key, month): the budget store's, which sits a layer
        # above the services (it acts through them), so it is handed in, not imported.
        self._budget_state = budget_state
        self._settled = SettledSplits(db)
        self._settling = anyio.Lock()  # one settling at a time (a report's, the hourly one)

    async def report(self, days: float, limit: int = 0, only: str = "") -> dict[str, Any]:
        """The report over the last `days`, listing the `limit` costliest clusters (0: all),
        or with `only` that cluster name's incarnations.
        What is settled is summed in SQL; what is not (live, straddling the window's start,
        torn down lately) is split here."""
        await self.settle()
        window = Window(since=time.time() - days * DAY, now=time.time())
        intervals = await self._settled.unsettled_in(window.since)
        jobs: dict[Key, list[JobSpan]] = {}

        async def read_jobs() -> None:
            keys = {(i.cluster, i.incarnation) for i in intervals}
            jobs.update(await anyio.to_thread.run_sync(self._jobs, keys))
            jobs.update(await self._managed_spans(keys))

        async with anyio.create_task_group() as group:
            group.start_soon(read_jobs)  # files, on a core of their own beside the queries
            settled = await self._settled.summary(window.since, limit, only)
            listed = await self._settled.listed_intervals(window.since, limit, only)
            days_spent = await self.ledger.spend_by_day(window.since, window.now)
            up_times = await self._up_times(min((i.started_at for i in intervals),
                                                default=window.now))
        names = {job.id: job.name for job in self._managed.all()}
        # In a worker thread: thousands of clusters would hold the event loop for long.
        report = await anyio.to_thread.run_sync(functools.partial(
            build, window, intervals, up_times,
            lambda name, incarnation: jobs.get((name, incarnation), []), names, limit,
            settled, listed, days_spent, only))
        report["budgets"] = await self.budgets(window.now)
        return report

    async def budgets(self, now: float) -> list[dict[str, Any]]:
        """Each configured budget's month so far, as the controller would observe it now."""
        found = []
        for budget in self._budgets():
            seen = await measure(self.ledger, budget.provider, now)
            state = (self._budget_state(budget.key, seen.month)
                     if self._budget_state is not None else BudgetState(budget.key, seen.month))
            found.append(budget_view(budget, state, seen.month, seen.spent, seen.burn_rate, now))
        return found

    async def settle(self) -> int:
        """Settle every incarnation whose inputs are final now; returns how many."""
        async with self._settling:
            candidates = await self._settled.unsettled(time.time() - SETTLE_AFTER)
            if not candidates:
                return 0
            first = min(own[0].started_at for own in candidates.values())
            up_times = await self._up_times(first)
            final = await anyio.to_thread.run_sync(self._final, candidates.keys())
            jobs = await anyio.to_thread.run_sync(self._jobs, final)
            jobs.update(await self._managed_spans(final))
            splits = [(own, split_cluster(own, up_times.get(name, []),
                                          jobs.get((name, incarnation), []),
                                          max(i.ended_at or 0.0 for i in own)))
                      for (name, incarnation), own in candidates.items()
                      # A kept copy not closed out yet: its jobs may still change.
                      if (name, incarnation) in final]
            await self._settled.settle(splits)
            return len(splits)

    async def _managed_spans(self, keys: Iterable[Key]) -> dict[Key, list[JobSpan]]:
        """The job of each managed job's cluster among `keys`: its stretches RUNNING, from the
        managed job's events (such a cluster has no kept copy: the controller keeps its log).
        Every incarnation gets all of them; each counts only the time its own nodes ran."""
        owners = {record.cluster: record for record in self._managed.all()}
        owned = [key for key in keys if key[0] in owners]
        if not owned:
            return {}
        by_id = {owners[name].id: owners[name] for name, _ in owned}
        ids = sorted(by_id)
        rows = await self._db.fetchall(
            "SELECT job_id, ts, from_status, to_status FROM managed_job_events"
            f" WHERE job_id IN ({', '.join('?' for _ in ids)}) ORDER BY id", ids)
        spans: dict[int, list[JobSpan]] = {}
        since: dict[int, float] = {}
        for row in rows:
            job_id = row["job_id"]
            if row["to_status"] == "RUNNING":
                since.setdefault(job_id, row["ts"])
            elif row["from_status"] == "RUNNING" and job_id in since:
                spans.setdefault(job_id, []).append(
                    _run_span(by_id[job_id], since.pop(job_id), row["ts"]))
        for job_id, started in since.items():  # running now
            spans.setdefault(job_id, []).append(_run_span(by_id[job_id], started, None))
        return {key: spans.get(owners[key[0]].id, []) for key in owned}

    async def _up_times(self, since: float) -> dict[str, list[float]]:
        """Per cluster name, when it became UP (from its events, oldest first)."""
        rows = await self._db.fetchall(
            "SELECT cluster, ts FROM cluster_events WHERE kind = 'status' AND to_status = 'UP'"
            " AND ts >= ? ORDER BY ts", [since])
        up_times: dict[str, list[float]] = {}
        for row in rows:
            up_times.setdefault(row["cluster"], []).append(row["ts"])
        return up_times

    def _jobs(self, wanted: Iterable[Key]) -> dict[Key, list[JobSpan]]:
        """Each incarnation's jobs from its kept copy (none without one: kept logs off, or
        pruned from the history). Blocks: file reads."""
        kept = self._kept
        if kept is None:
            return {}
        return {key: [JobSpan(j.job_id, j.started_at, j.ended_at, j.num_nodes)
                      for j in kept.jobs(_directory(kept, key)).values()] for key in wanted}

    def _final(self, wanted: Iterable[Key]) -> set[Key]:
        """The incarnations whose jobs will not change: their kept copy is closed out, or
        there is none. Blocks: file reads."""
        kept = self._kept
        if kept is None:
            return set(wanted)
        return {key for key in wanted
                if (copy := kept.cluster(_directory(kept, key))) is None
                or copy.torn_down_at is not None}


def _directory(kept: KeptLogStore, key: Key) -> Path:
    return kept.root / KeptCluster(key[0], "", "", key[1]).key


# A managed job's run holds every node of its cluster (attribution caps a claim at the
# cluster's own count).
EVERY_NODE = 1 << 30


def _run_span(record: ManagedJobRecord, started: float, ended: float | None) -> JobSpan:
    return JobSpan(record.agent_job_id or 1, started, ended, EVERY_NODE)


def budget_view(budget: Budget, state: BudgetState, month: str, spent: float, rate: float,
                now: float) -> dict[str, Any]:
    """A budget's month for `cost_report`: `level` as the controller recorded it this month
    (a record of an earlier month is clear), and `text` what its last decision said."""
    level = level_in(state, month)
    return {"provider": budget.provider, "monthly": budget.monthly, "warn_at": budget.warn_at,
            "action": str(budget.action), "month": month, "spent": round(spent, 6),
            "burn_rate": round(rate, 6),
            "level": str(level),
            "text": state.text if level != Level.CLEAR else "",
            "projection": projection(budget, spent, rate, now)}
