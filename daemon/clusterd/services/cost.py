"""`cost_report`: the records the report needs (the ledger's intervals, when each cluster
became UP, each incarnation's jobs as the kept copies last saw them, managed jobs' names),
gathered for cost/report.py."""

from __future__ import annotations

import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import anyio

from clusterd.cost.attribution import JobSpan
from clusterd.cost.ledger import Ledger
from clusterd.cost.report import Window, build
from clusterd.keptlogs.store import KeptCluster, KeptLogStore
from clusterd.managed.store import ManagedJobStore
from clusterd.state.db import Database

DAY = 86400.0


class CostService:
    def __init__(self, ledger: Ledger, db: Database, kept: KeptLogStore | None,
                 managed: ManagedJobStore) -> None:
        self.ledger = ledger
        self._db = db
        self._kept = kept
        self._managed = managed

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
        return build(window, intervals, up_times,
                     lambda name, incarnation: jobs.get((name, incarnation), ()), names)

    def _jobs(self, wanted: set[tuple[str, float]]) -> dict[tuple[str, float], Sequence[JobSpan]]:
        """Each incarnation's jobs from its kept copies (blocks: file reads)."""
        kept = self._kept
        if kept is None:
            return {}
        found: dict[tuple[str, float], Sequence[JobSpan]] = {}
        for name, incarnation in wanted:
            # No copy (kept logs off, or pruned from the history): no jobs, all idle.
            directory: Path = kept.root / KeptCluster(name, "", "", incarnation).key
            spans = [JobSpan(j.job_id, j.started_at, j.ended_at, j.num_nodes)
                     for j in kept.jobs(directory).values()]
            if spans:
                found[(name, incarnation)] = spans
        return found
