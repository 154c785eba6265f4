"""`cost_report`: the records the report needs (the ledger's intervals, when each cluster
became UP, each incarnation's jobs as the kept copies last saw them, managed jobs' names),
gathered for cost/report.py; and each configured budget's month so far (spent, the burn
rate, its recorded level, the projection), so a page can show it while it is still clear."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio

from clusterd.cost.attribution import JobSpan
from clusterd.cost.budget import Budget, BudgetState, Level, month_of, month_start, projection
from clusterd.cost.ledger import Ledger
from clusterd.cost.report import Window, build
from clusterd.keptlogs.store import KeptCluster, KeptLogStore
from clusterd.managed.store import ManagedJobStore
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

    async def report(self, days: float) -> dict[str, Any]:
        window = Window(since=time.time() - days * DAY, now=time.time())
        intervals = await self.ledger.intervals(window.since)
        first = min((i.started_at for i in intervals), default=window.now)
        rows = await self._db.fetchall(
            "SELECT cluster, ts FROM cluster_events WHERE kind = 'status' AND to_status = 'UP'"
            " AND ts >= ? ORDER BY ts", [first])
        up_times: dict[str, list[float]] = {}
        for row in rows:
            up_times.setdefault(row["cluster"], []).append(row["ts"])
        wanted = {(i.cluster, i.incarnation) for i in intervals}
        jobs = await anyio.to_thread.run_sync(self._jobs, wanted)
        names = {job.id: job.name for job in self._managed.all()}
        report = build(window, intervals, up_times,
                       lambda name, incarnation: jobs.get((name, incarnation), ()), names)
        report["budgets"] = await self.budgets(window.now)
        return report

    async def budgets(self, now: float) -> list[dict[str, Any]]:
        """Each configured budget's month so far, as the controller would observe it now."""
        month = month_of(now)
        found = []
        for budget in self._budgets():
            spent = await self.ledger.spend(month_start(now), None, budget.provider)
            rate = await self.ledger.burn_rate(budget.provider)
            state = (self._budget_state(budget.key, month)
                     if self._budget_state is not None else BudgetState(budget.key, month))
            found.append(budget_view(budget, state, month, spent, rate, now))
        return found

    def _jobs(self, wanted: set[tuple[str, float]]) -> dict[tuple[str, float], Sequence[JobSpan]]:
        """Each incarnation's jobs from its kept copies (blocks: file reads)."""
        kept = self._kept
        if kept is None:
            return {}
        found: dict[tuple[str, float], Sequence[JobSpan]] = {}
        for name, incarnation in wanted:
            key = KeptCluster(name, "", "", incarnation).key
            directory: Path = kept.root / key
            if directory.is_dir():
                found[(name, incarnation)] = [
                    JobSpan(j.job_id, j.started_at, j.ended_at, j.num_nodes)
                    for j in kept.jobs(directory).values()]
        return found


def budget_view(budget: Budget, state: BudgetState, month: str, spent: float, rate: float,
                now: float) -> dict[str, Any]:
    """A budget's month for `cost_report`: `level` as the controller recorded it this month
    (a record of an earlier month is clear), and `text` what its last decision said."""
    current = state.month == month
    return {"provider": budget.provider, "monthly": budget.monthly, "warn_at": budget.warn_at,
            "action": str(budget.action), "month": month, "spent": round(spent, 6),
            "burn_rate": round(rate, 6),
            "level": str(state.level if current else Level.CLEAR),
            "text": state.text if current and state.level != Level.CLEAR else "",
            "projection": projection(budget, spent, rate, now)}
