"""The agent's job queue: SQLite on the head node, mirrored in memory (the agent is its only
writer, so listings never wait on disk)."""

from __future__ import annotations

import dataclasses
import json
import time
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from clusterctl.protocol import JobStatus
from clusterd import sqlite

SCHEMA = """
CREATE TABLE IF NOT EXISTS jobs (
    job_id INTEGER PRIMARY KEY AUTOINCREMENT,
    name TEXT NOT NULL,
    user TEXT NOT NULL,
    status TEXT NOT NULL,
    submitted_at REAL NOT NULL,
    started_at REAL,
    ended_at REAL,
    spec TEXT NOT NULL,
    has_secrets INTEGER NOT NULL,
    resources_display TEXT NOT NULL,
    num_nodes INTEGER NOT NULL,
    log_dir TEXT NOT NULL DEFAULT '',
    task_id TEXT NOT NULL DEFAULT '',
    failure_reason TEXT NOT NULL DEFAULT '',
    exit_codes TEXT NOT NULL DEFAULT '[]',
    processes TEXT NOT NULL DEFAULT '[]'
);
CREATE TABLE IF NOT EXISTS settings (key TEXT PRIMARY KEY, value TEXT NOT NULL);
"""


@dataclasses.dataclass
class Job:
    job_id: int
    name: str
    user: str
    status: JobStatus
    submitted_at: float
    spec: dict[str, Any]  # JobSpec fields as JSON, secrets removed
    has_secrets: bool
    resources_display: str
    num_nodes: int
    started_at: float | None = None
    ended_at: float | None = None
    log_dir: str = ""
    task_id: str = ""
    failure_reason: str = ""
    exit_codes: list[int] = dataclasses.field(default_factory=list)
    # Where its processes run, so they can be killed even after an agent restart.
    processes: list[dict[str, Any]] = dataclasses.field(default_factory=list)

    @property
    def active(self) -> bool:
        return not self.status.is_terminal


_JSON_FIELDS = {"spec", "exit_codes", "processes"}


def _to_column(name: str, value: Any) -> Any:
    if name in _JSON_FIELDS:
        return json.dumps(value)
    if isinstance(value, JobStatus):
        return str(value)
    if isinstance(value, bool):
        return int(value)
    return value


class JobStore:
    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: aiosqlite.Connection | None = None
        self._jobs: dict[int, Job] = {}
        # The unfinished ones, kept apart: the scheduler asks for them on every turn, and
        # the store keeps thousands of finished jobs (a scan cost the agent ~2 ms a job).
        self._active: dict[int, Job] = {}
        self._lock = anyio.Lock()

    async def open(self) -> None:
        # Every write below is one statement, committed as it runs.
        self._conn = await sqlite.connect(self.path, autocommit=True)
        await self._conn.executescript(SCHEMA)
        async with self._conn.execute("SELECT * FROM jobs ORDER BY job_id") as cursor:
            for row in await cursor.fetchall():
                values = dict(row)
                for name in _JSON_FIELDS:
                    values[name] = json.loads(values[name])
                values["status"] = JobStatus(values["status"])
                values["has_secrets"] = bool(values["has_secrets"])
                job = Job(**values)
                self._jobs[job.job_id] = job
                self._track(job)

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @property
    def _db(self) -> aiosqlite.Connection:
        assert self._conn is not None, "job store is not open"
        return self._conn

    async def add(
        self,
        *,
        name: str,
        user: str,
        spec: dict[str, Any],
        has_secrets: bool,
        resources_display: str,
        num_nodes: int,
    ) -> Job:
        now = time.time()
        with anyio.CancelScope(shield=True):
            async with self._lock:
                cursor = await self._db.execute(
                    "INSERT INTO jobs (name, user, status, submitted_at, spec, has_secrets,"
                    " resources_display, num_nodes) VALUES (?,?,?,?,?,?,?,?)",
                    (name, user, str(JobStatus.INIT), now, json.dumps(spec), int(has_secrets),
                     resources_display, num_nodes),
                )
        assert cursor.lastrowid is not None
        job = Job(cursor.lastrowid, name, user, JobStatus.INIT, now, spec, has_secrets,
                  resources_display, num_nodes)
        self._jobs[job.job_id] = job
        self._track(job)
        return job

    async def update(self, job: Job, **fields: Any) -> None:
        for key, value in fields.items():
            setattr(job, key, value)
        self._track(job)
        assignments = ", ".join(f"{key} = ?" for key in fields)
        params = [_to_column(key, value) for key, value in fields.items()]
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await self._db.execute(
                    f"UPDATE jobs SET {assignments} WHERE job_id = ?", (*params, job.job_id)
                )

    def get(self, job_id: int) -> Job | None:
        return self._jobs.get(job_id)

    def latest(self) -> Job | None:
        return self._jobs[max(self._jobs)] if self._jobs else None

    def __len__(self) -> int:
        return len(self._jobs)

    def all(self) -> list[Job]:
        return list(self._jobs.values())

    def active(self) -> list[Job]:
        """The unfinished jobs, oldest first."""
        return sorted(self._active.values(), key=lambda job: job.job_id)

    def _track(self, job: Job) -> None:
        if job.active:
            self._active[job.job_id] = job
        else:
            self._active.pop(job.job_id, None)

    async def prune(self, keep: int) -> list[int]:
        """Forget the oldest finished jobs beyond `keep` records in all; returns their ids
        (their logs are the caller's to remove). Active jobs are never forgotten."""
        excess = len(self._jobs) - keep
        if excess <= 0:
            return []
        victims = sorted(j.job_id for j in self._jobs.values() if not j.active)[:excess]
        with anyio.CancelScope(shield=True):
            async with self._lock:
                for start in range(0, len(victims), 500):
                    chunk = victims[start:start + 500]
                    await self._db.execute(
                        f"DELETE FROM jobs WHERE job_id IN ({','.join('?' * len(chunk))})",
                        chunk)
        for job_id in victims:
            del self._jobs[job_id]
        return victims

    async def get_setting(self, key: str) -> str | None:
        async with self._db.execute("SELECT value FROM settings WHERE key = ?", (key,)) as c:
            row = await c.fetchone()
        return None if row is None else str(row[0])

    async def set_setting(self, key: str, value: str) -> None:
        with anyio.CancelScope(shield=True):
            async with self._lock:
                await self._db.execute(
                    "INSERT INTO settings (key, value) VALUES (?, ?)"
                    " ON CONFLICT(key) DO UPDATE SET value = excluded.value",
                    (key, value),
                )
