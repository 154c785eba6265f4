"""Persistent records of requests: what was asked, by which op, and how it ended."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from clusterd.state.db import Database, dumps, loads


class RequestState:
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLED = "CANCELLED"
    INTERRUPTED = "INTERRUPTED"  # the daemon stopped or died while it ran


@dataclasses.dataclass
class RequestRecord:
    id: int
    op: str
    cluster: str | None
    args: dict[str, Any]
    status: str
    created_at: float
    finished_at: float | None = None
    error_code: str | None = None
    error_message: str | None = None
    result: dict[str, Any] | None = None
    # The request's events as [name, data] pairs (progress, blocked, job), bounded: kept so
    # that following a finished request replays them. Left out of `to_wire` (a listing of
    # fifty requests does not carry fifty step lists).
    steps: list[list[Any]] | None = None

    def to_wire(self) -> dict[str, Any]:
        wire = dataclasses.asdict(self)
        del wire["steps"]
        return wire


# Every column but the steps: what listings read.
_LISTED = ("id, op, cluster, args, status, created_at, finished_at, error_code, error_message,"
           " result")


class RequestStore:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def create(self, op: str, cluster: str | None, args: dict[str, Any]) -> RequestRecord:
        """`args` must already be stripped of secrets."""
        now = time.time()
        request_id = await self._db.write(
            [("INSERT INTO requests (op, cluster, args, status, created_at) VALUES (?,?,?,?,?)",
              [op, cluster, dumps(args), RequestState.RUNNING, now])]
        )
        assert request_id is not None
        return RequestRecord(request_id, op, cluster, args, RequestState.RUNNING, now)

    async def finish(
        self,
        request_id: int,
        status: str,
        *,
        error_code: str | None = None,
        error_message: str | None = None,
        result: dict[str, Any] | None = None,
        steps: list[list[Any]] | None = None,
    ) -> None:
        await self._db.write(
            [("UPDATE requests SET status=?, finished_at=?, error_code=?, error_message=?,"
              " result=?, steps=? WHERE id=?",
              [status, time.time(), error_code, error_message,
               None if result is None else dumps(result),
               None if steps is None else dumps(steps), request_id])]
        )

    async def mark_interrupted(self) -> list[RequestRecord]:
        """On start: requests left RUNNING by a daemon that died are over; say so."""
        rows = await self._db.fetchall("SELECT * FROM requests WHERE status = ?",
                                       [RequestState.RUNNING])
        if rows:
            await self._db.write(
                [("UPDATE requests SET status=?, finished_at=?, error_message=? WHERE status=?",
                  [RequestState.INTERRUPTED, time.time(), "clusterd stopped while it ran",
                   RequestState.RUNNING])]
            )
        return [self._from_row(row) for row in rows]

    async def prune(self, keep: int) -> int:
        """Forget finished requests beyond the newest `keep` (as events are pruned); returns
        how many went."""
        rows = await self._db.fetchall("SELECT MAX(id) AS top FROM requests")
        top = rows[0]["top"] if rows and rows[0]["top"] is not None else 0
        before = await self._db.fetchall("SELECT COUNT(*) AS n FROM requests")
        await self._db.write([("DELETE FROM requests WHERE id <= ? AND status != ?",
                               [top - keep, RequestState.RUNNING])])
        after = await self._db.fetchall("SELECT COUNT(*) AS n FROM requests")
        return int(before[0]["n"]) - int(after[0]["n"])

    async def recent(self, limit: int = 50) -> list[RequestRecord]:
        rows = await self._db.fetchall(
            f"SELECT {_LISTED} FROM requests ORDER BY id DESC LIMIT ?", [limit])
        return [self._from_row(row) for row in rows]

    async def get(self, request_id: int) -> RequestRecord | None:
        rows = await self._db.fetchall("SELECT * FROM requests WHERE id = ?", [request_id])
        return self._from_row(rows[0]) if rows else None

    @staticmethod
    def _from_row(row: Any) -> RequestRecord:
        values = dict(row)
        values["args"] = loads(values["args"]) or {}
        values["result"] = loads(values["result"])
        values["steps"] = loads(values.get("steps"))
        return RequestRecord(**values)
