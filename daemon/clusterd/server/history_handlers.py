"""The history of torn-down clusters (`clusterctl history`): keptlogs/store.py's rows."""

from __future__ import annotations

import dataclasses
from typing import Any

import anyio

from clusterctl import protocol
from clusterd.keptlogs.store import KeptLogStore

from .connection import Call

MAX_HISTORY_LIMIT = 10_000


class HistoryHandlers:
    def __init__(self, kept: KeptLogStore | None) -> None:
        self._kept = kept

    def table(self) -> dict[str, Any]:
        return {protocol.HistoryArgs.op: self.history}

    async def history(self, call: Call, args: protocol.HistoryArgs) -> dict[str, Any]:
        if self._kept is None:  # a daemon built without one (tests of other parts)
            return {"clusters": []}
        limit = max(1, min(args.limit, MAX_HISTORY_LIMIT))
        rows = await anyio.to_thread.run_sync(self._kept.history, args.cluster or None, limit)
        return {"clusters": [
            {**dataclasses.asdict(cluster), "jobs": [job.to_json() for job in jobs]}
            for cluster, jobs in rows]}
