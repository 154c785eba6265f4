"""The state database: aiosqlite in WAL mode, with a schema version and ordered migrations."""

from __future__ import annotations

import contextlib
import json
from collections.abc import AsyncIterator, Iterable, Sequence
from pathlib import Path
from typing import Any

import aiosqlite
import anyio

from clusterd import sqlite

# Each entry migrates from version i to i + 1. Never edit a released entry; append a new one.
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE clusters (
        name TEXT PRIMARY KEY,
        provider TEXT NOT NULL,
        cloud_name TEXT NOT NULL,
        status TEXT NOT NULL,
        status_reason TEXT NOT NULL DEFAULT '',
        num_nodes INTEGER NOT NULL,
        requested_resources TEXT NOT NULL,
        launched_resources TEXT,
        handle TEXT,
        config_hash TEXT NOT NULL,
        autostop_minutes REAL,
        autostop_down INTEGER NOT NULL DEFAULT 0,
        autostop_wait_for TEXT NOT NULL DEFAULT 'jobs_and_ssh',
        created_at REAL NOT NULL,
        launched_at REAL,
        status_updated_at REAL NOT NULL,
        refreshed_at REAL,
        ever_up INTEGER NOT NULL DEFAULT 0,
        launch_request_id INTEGER
    );
    CREATE TABLE cluster_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        cluster TEXT NOT NULL,
        kind TEXT NOT NULL,
        from_status TEXT,
        to_status TEXT,
        reason TEXT NOT NULL,
        request_id INTEGER
    );
    CREATE INDEX cluster_events_by_cluster ON cluster_events (cluster, id);
    CREATE TABLE requests (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        op TEXT NOT NULL,
        cluster TEXT,
        args TEXT NOT NULL,
        status TEXT NOT NULL,
        created_at REAL NOT NULL,
        finished_at REAL,
        error_code TEXT,
        error_message TEXT,
        result TEXT
    );
    CREATE INDEX requests_by_status ON requests (status);
    """,
    # 2: autostop deadlines survive restarts.
    """
    ALTER TABLE clusters ADD COLUMN autostop_set_at REAL;
    ALTER TABLE clusters ADD COLUMN autostop_deadline REAL;
    """,
    # 3: managed jobs (see clusterd/managed/store.py) and their status history.
    """
    CREATE TABLE managed_jobs (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        name TEXT NOT NULL,
        task TEXT NOT NULL,
        status TEXT NOT NULL,
        status_reason TEXT NOT NULL DEFAULT '',
        cluster TEXT NOT NULL,
        task_id TEXT NOT NULL,
        attempts INTEGER NOT NULL DEFAULT 0,
        recoveries INTEGER NOT NULL DEFAULT 0,
        user_restarts INTEGER NOT NULL DEFAULT 0,
        agent_job_id INTEGER,
        log_base INTEGER NOT NULL DEFAULT 0,
        ending TEXT,
        placed TEXT,
        submitted_at REAL NOT NULL,
        started_at REAL,
        ended_at REAL,
        status_updated_at REAL NOT NULL,
        run_started_at REAL,
        run_seconds REAL NOT NULL DEFAULT 0
    );
    CREATE TABLE managed_job_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        job_id INTEGER NOT NULL,
        from_status TEXT,
        to_status TEXT,
        reason TEXT NOT NULL
    );
    CREATE INDEX managed_job_events_by_job ON managed_job_events (job_id, id);
    """,
    # 4: buckets clusterd made (see clusterd/storage/registry.py), and the clusters using them.
    """
    CREATE TABLE buckets (
        name TEXT PRIMARY KEY,
        region TEXT NOT NULL,
        state TEXT NOT NULL,
        persistent INTEGER NOT NULL,
        created_for TEXT NOT NULL,
        created_at REAL NOT NULL
    );
    CREATE TABLE bucket_users (
        bucket TEXT NOT NULL REFERENCES buckets (name) ON DELETE CASCADE,
        cluster TEXT NOT NULL,
        PRIMARY KEY (bucket, cluster)
    );
    """,
    # 5: who created a cluster (NULL: its user; `managed-job:N`: that managed job, the only
    # one that may reuse, cancel jobs on or tear it down), and managed jobs' bucket holds
    # named so no cluster name can spell them. Only what the records vouch for is marked a
    # job's: a cluster launched by the controller's own request for an unfinished job of
    # that cluster name, and a bucket user `managed-job-N` where job N exists and no cluster
    # has that name.
    """
    ALTER TABLE clusters ADD COLUMN owner TEXT;
    UPDATE clusters SET owner = (
        SELECT 'managed-job:' || m.id FROM managed_jobs m
        WHERE m.cluster = clusters.name AND m.status NOT IN (
            'SUCCEEDED', 'CANCELLED', 'FAILED', 'FAILED_SETUP', 'FAILED_PRECHECKS',
            'FAILED_NO_RESOURCE', 'FAILED_CONTROLLER'))
    WHERE launch_request_id IN (
        SELECT id FROM requests WHERE op = 'launch' AND args LIKE '%"by":"managed job"%');
    UPDATE bucket_users SET cluster = 'managed-job:' || substr(cluster, 13)
    WHERE cluster GLOB 'managed-job-[0-9]*'
        AND substr(cluster, 13) IN (SELECT CAST(id AS TEXT) FROM managed_jobs)
        AND cluster NOT IN (SELECT name FROM clusters);
    """,
    # 6: the bucket mounts each cluster's nodes have (see clusterd/storage/cluster_mounts.py),
    # so a node made again gets them too.
    """
    CREATE TABLE cluster_bucket_mounts (
        cluster TEXT PRIMARY KEY,
        mounts TEXT NOT NULL
    );
    """,
    # 7: a finished request keeps its steps (progress lines, waits, jobs submitted), so its
    # page still shows how it went (see clusterd/requests.py, StepLog).
    """
    ALTER TABLE requests ADD COLUMN steps TEXT;
    """,
    # 8: the cost ledger (see clusterd/cost/ledger.py): each stretch of a cluster's nodes
    # running (or stopped, paying for disks) at the price that applied. At most one open
    # interval per cluster and kind, so a hook run twice (or after a restart) never counts
    # the same second twice.
    """
    CREATE TABLE cost_intervals (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        cluster TEXT NOT NULL,
        incarnation REAL NOT NULL,
        cloud_name TEXT NOT NULL,
        provider TEXT NOT NULL,
        infra TEXT NOT NULL,
        instance_type TEXT,
        nodes INTEGER NOT NULL,
        kind TEXT NOT NULL CHECK (kind IN ('running', 'stopped')),
        started_at REAL NOT NULL,
        ended_at REAL,
        node_price_per_hour REAL NOT NULL,
        disk_price_per_hour REAL NOT NULL,
        source TEXT NOT NULL,
        owner TEXT
    );
    CREATE UNIQUE INDEX cost_intervals_open ON cost_intervals (cluster, kind)
        WHERE ended_at IS NULL;
    CREATE INDEX cost_intervals_by_end ON cost_intervals (ended_at);
    """,
    # 9: each budget's recorded state this month (see clusterd/cost/budget_store.py): its
    # level and whether the action on exceeding it is done, written before it is acted on;
    # and the budgets' events.
    """
    CREATE TABLE budget_states (
        key TEXT PRIMARY KEY,
        month TEXT NOT NULL,
        level TEXT NOT NULL,
        monthly_at_level REAL NOT NULL,
        acted INTEGER NOT NULL DEFAULT 0,
        spent REAL NOT NULL DEFAULT 0,
        text TEXT NOT NULL DEFAULT '',
        updated_at REAL NOT NULL
    );
    CREATE TABLE budget_events (
        id INTEGER PRIMARY KEY AUTOINCREMENT,
        ts REAL NOT NULL,
        key TEXT NOT NULL,
        kind TEXT NOT NULL,
        text TEXT NOT NULL
    );
    """,
    # 10: torn-down cluster incarnations' cost splits, settled once their inputs are final
    # (see clusterd/cost/settled.py): a report sums them in SQL and reads only the rows it
    # lists. Intervals indexed by incarnation, as the settling and the retention group them.
    """
    CREATE TABLE cost_settled (
        cluster TEXT NOT NULL,
        incarnation REAL NOT NULL,
        started_at REAL NOT NULL,
        ended_at REAL NOT NULL,
        provider TEXT NOT NULL,
        owner TEXT,
        total REAL NOT NULL,
        provisioning REAL NOT NULL,
        idle REAL NOT NULL,
        stopped REAL NOT NULL,
        jobs TEXT NOT NULL,
        PRIMARY KEY (cluster, incarnation)
    );
    CREATE INDEX cost_settled_by_start ON cost_settled (started_at);
    CREATE INDEX cost_intervals_by_incarnation ON cost_intervals (cluster, incarnation);
    """,
)
SCHEMA_VERSION = len(MIGRATIONS)


class SchemaTooNew(RuntimeError):
    pass


class Database:
    """One connection, writes serialized; every write is committed before it returns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._conn: aiosqlite.Connection | None = None
        self._write_lock = anyio.Lock()

    async def open(self) -> None:
        self._conn = await sqlite.connect(self.path)
        try:
            await self._conn.execute("PRAGMA foreign_keys=ON")
            await self._migrate()
        except BaseException:
            await self.close()  # aiosqlite's thread would otherwise keep the process alive
            raise

    async def close(self) -> None:
        if self._conn is not None:
            await self._conn.close()
            self._conn = None

    @property
    def conn(self) -> aiosqlite.Connection:
        if self._conn is None:
            raise RuntimeError("database is not open")
        return self._conn

    async def _migrate(self) -> None:
        version = await self.schema_version()
        if version > SCHEMA_VERSION:
            raise SchemaTooNew(
                f"{self.path} has schema version {version}, newer than this clusterd "
                f"({SCHEMA_VERSION}); upgrade clusterd"
            )
        for target in range(version, SCHEMA_VERSION):
            await self.conn.executescript(
                f"BEGIN; {MIGRATIONS[target]}; PRAGMA user_version={target + 1}; COMMIT;"
            )

    async def schema_version(self) -> int:
        async with self.conn.execute("PRAGMA user_version") as cursor:
            row = await cursor.fetchone()
        return int(row[0]) if row else 0

    async def fetchall(self, sql: str, params: Sequence[Any] = ()) -> list[aiosqlite.Row]:
        async with self.conn.execute(sql, params) as cursor:
            return list(await cursor.fetchall())

    @contextlib.asynccontextmanager
    async def _transaction(self) -> AsyncIterator[aiosqlite.Connection]:
        """One transaction under the write lock, committed on success and rolled back on any
        error. Shielded from cancellation: a request cancelled mid-write still leaves a whole
        record."""
        with anyio.CancelScope(shield=True), anyio.fail_after(30):
            async with self._write_lock:
                try:
                    yield self.conn
                    await self.conn.commit()
                except BaseException:
                    await self.conn.rollback()
                    raise

    async def write(self, statements: Iterable[tuple[str, Sequence[Any]]]) -> int | None:
        """Run statements in one transaction; returns the last statement's lastrowid."""
        last: int | None = None
        async with self._transaction() as conn:
            for sql, params in statements:
                cursor = await conn.execute(sql, params)
                last = cursor.lastrowid
        return last

    async def write_many(self, sql: str, rows: Sequence[Sequence[Any]]) -> None:
        """One statement over many rows, in one transaction and one trip to SQLite's thread."""
        async with self._transaction() as conn:
            await conn.executemany(sql, rows)


def dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def loads(text: str | None) -> Any:
    return json.loads(text) if text else None
