"""Managed job records and their status history.

As with clusters, the daemon is the only writer: records live in memory and are written
through to the database (each change committed, with its event, before the call returns).
The task is kept as submitted, minus secret values (see `SubmittedTask`): enough to load it
again after a restart and relaunch it elsewhere.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from clusterctl.protocol import ManagedJobStatus
from clusterd.managed import transitions
from clusterd.providers.base import Placement
from clusterd.redact import redact_envs, redact_task_yaml, redact_urls
from clusterd.state.db import Database, dumps, loads
from clusterd.state.resources import placement_from_text, placement_text


@dataclasses.dataclass(frozen=True)
class SubmittedTask:
    """What `jobs launch` was given, as it may be stored: the YAML text with secret values
    removed (the names stay), or the command; the overrides; never a secret value, nor the
    credentials in a URL (`redacted` names where some were removed: a relaunch needs the
    values, which only the daemon's memory holds)."""

    yaml_text: str | None = None
    command: str | None = None
    source: str = "<task>"
    cwd: str = "/"
    envs: dict[str, str] = dataclasses.field(default_factory=dict)
    secret_names: tuple[str, ...] = ()
    num_nodes: int | None = None
    cpus: str | None = None
    name: str | None = None
    infra: str | None = None
    # The resources asked for, as `jobs queue` shows them ("2x[CPU:4, spot]"): kept, not
    # worked out again from the YAML for every listing.
    resources: str | None = None
    redacted: tuple[str, ...] = ()

    @classmethod
    def storable(cls, **values: Any) -> SubmittedTask:
        redacted: list[str] = []
        text = values.get("yaml_text")
        if text is not None:
            values["yaml_text"] = redact_task_yaml(text)
            if redact_urls(text) != text:
                redacted.append("the task YAML")
        for field in ("command", "source"):
            if values.get(field) is not None and redact_urls(values[field]) != values[field]:
                values[field] = redact_urls(values[field])
                redacted.append(field)
        envs = values.get("envs") or {}
        values["envs"] = redact_envs(envs)
        redacted += [f"env {k}" for k, v in envs.items() if values["envs"][k] != v]
        return cls(**values, redacted=tuple(redacted))

    def to_json(self) -> dict[str, Any]:
        data = dataclasses.asdict(self)
        data["secret_names"] = list(self.secret_names)
        data["redacted"] = list(self.redacted)
        return data

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SubmittedTask:
        known = {f.name for f in dataclasses.fields(cls)}
        values = {k: v for k, v in data.items() if k in known}
        values["secret_names"] = tuple(values.get("secret_names") or ())
        values["redacted"] = tuple(values.get("redacted") or ())
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ManagedJobRecord:
    id: int
    name: str
    task: SubmittedTask
    status: ManagedJobStatus
    cluster: str  # the one cluster this job may own: fixed at submission, so never two
    task_id: str  # SKYPILOT_TASK_ID, the same in every attempt
    submitted_at: float
    status_updated_at: float
    status_reason: str = ""
    attempts: int = 0  # runs submitted to a cluster
    recoveries: int = 0  # attempts ended by the loss of their cluster (then relaunched)
    user_restarts: int = 0  # user failures retried (max_restarts_on_errors)
    agent_job_id: int | None = None  # the current attempt's job on its cluster's agent
    log_base: int = 0  # where the current attempt's log starts in the local log file
    # The final status the job takes once its cluster is gone ("STATUS reason"); set before
    # the teardown, so a daemon killed during it finishes the teardown on restart.
    ending: str | None = None
    placed: Placement | None = None  # where its cluster is now (as that cluster's record says)
    started_at: float | None = None
    ended_at: float | None = None
    run_started_at: float | None = None  # the current attempt RUNNING since
    run_seconds: float = 0.0  # time RUNNING in earlier attempts

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        row["status"] = str(self.status)
        row["task"] = dumps(self.task.to_json())
        row["placed"] = None if self.placed is None else placement_text(self.placed)
        return row

    @classmethod
    def from_row(cls, row: Any) -> ManagedJobRecord:
        values = dict(row)
        values["status"] = ManagedJobStatus(values["status"])
        values["task"] = SubmittedTask.from_json(loads(values["task"]) or {})
        values["placed"] = placement_from_text(values["placed"])
        return cls(**values)

    def job_seconds(self, now: float | None = None) -> float:
        """Time spent RUNNING, over every attempt."""
        current = (now or time.time()) - self.run_started_at if self.run_started_at else 0.0
        return self.run_seconds + current


@dataclasses.dataclass(frozen=True)
class ManagedJobEvent:
    id: int
    ts: float
    job_id: int
    from_status: str | None
    to_status: str | None
    reason: str


_COLUMNS = [f.name for f in dataclasses.fields(ManagedJobRecord)]
_INSERT_EVENT = ("INSERT INTO managed_job_events (ts, job_id, from_status, to_status, reason)"
                 " VALUES (?, ?, ?, ?, ?)")


def cluster_name_for(job_id: int, name: str) -> str:
    """`mj-ID-NAME`, NAME cut to a valid cluster name (lower case, letters, digits, '-')."""
    cleaned = "".join(c if c.isascii() and c.isalnum() else "-" for c in name.lower()
                      ).strip("-")
    return f"mj-{job_id}-{cleaned[:24].rstrip('-') or 'job'}"


OWNER_PREFIX = "managed-job:"


def owner_tag(job_id: int) -> str:
    """A managed job as the owner of what it made: the clusters it launched (their records'
    `owner`) and the buckets made for its task, across its clusters (`clusterctl storage ls`
    shows it among their users). The ':' is in no cluster name: no cluster can pass for it."""
    return f"{OWNER_PREFIX}{job_id}"


class ManagedJobStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._records: dict[int, ManagedJobRecord] = {}

    async def load(self) -> None:
        rows = await self._db.fetchall("SELECT * FROM managed_jobs")
        self._records = {row["id"]: ManagedJobRecord.from_row(row) for row in rows}

    def get(self, job_id: int) -> ManagedJobRecord | None:
        return self._records.get(job_id)

    def all(self) -> list[ManagedJobRecord]:
        return sorted(self._records.values(), key=lambda r: r.id)

    def active(self) -> list[ManagedJobRecord]:
        return [r for r in self.all() if not r.status.is_final]

    def holds_buckets(self, owner: str) -> bool:
        """Whether `owner` (a bucket user's name) is an unfinished managed job: its buckets
        stay while it runs, whatever becomes of its clusters."""
        number = owner.removeprefix(OWNER_PREFIX)
        if number == owner or not number.isdigit():
            return False
        record = self.get(int(number))
        return record is not None and not record.status.is_final

    def owner_of(self, cluster: str) -> ManagedJobRecord | None:
        """The unfinished managed job whose cluster this is, if any."""
        return next((r for r in self.active() if r.cluster == cluster), None)

    async def insert(self, name: str, task: SubmittedTask, task_id_prefix: str,
                     taken: Callable[[str], bool] = lambda _: False) -> ManagedJobRecord:
        """A new PENDING job. Its cluster's name is fixed here, with its id, in one
        transaction: the id comes from SQLite, then the row is completed. A name `taken`
        (a cluster of the user's that has it) gets a suffix: the job never shares it."""
        now = time.time()
        reason = "submitted"
        async with self._db._transaction() as conn:
            cursor = await conn.execute(
                "INSERT INTO managed_jobs (name, task, status, status_reason, cluster, task_id,"
                " submitted_at, status_updated_at) VALUES (?, ?, ?, ?, '', '', ?, ?)",
                (name, dumps(task.to_json()), str(ManagedJobStatus.PENDING), reason, now, now))
            job_id = int(cursor.lastrowid or 0)
            cluster = base = cluster_name_for(job_id, name)
            suffix = 1
            while taken(cluster):
                suffix += 1
                cluster = f"{base}-{suffix}"
            stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now))
            task_id = f"{task_id_prefix}-{stamp}-{int((now % 1) * 1e6):06d}_{cluster}"
            await conn.execute("UPDATE managed_jobs SET cluster = ?, task_id = ? WHERE id = ?",
                               (cluster, task_id, job_id))
            await conn.execute(_INSERT_EVENT, (now, job_id, None,
                                               str(ManagedJobStatus.PENDING), reason))
        record = ManagedJobRecord(id=job_id, name=name, task=task,
                                  status=ManagedJobStatus.PENDING, cluster=cluster,
                                  task_id=task_id, submitted_at=now, status_updated_at=now,
                                  status_reason=reason)
        self._records[job_id] = record
        return record

    async def update(self, job_id: int, **fields: Any) -> ManagedJobRecord:
        """Change fields other than the status."""
        if "status" in fields:
            raise ValueError("use set_status to change a managed job's status")
        record = self._require(job_id)
        updated = dataclasses.replace(record, **fields)
        row = updated.to_row()
        assignments = ", ".join(f"{key} = ?" for key in fields)
        await self._db.write([(f"UPDATE managed_jobs SET {assignments} WHERE id = ?",
                               [row[key] for key in fields] + [job_id])])
        self._records[job_id] = updated
        return updated

    async def set_status(self, job_id: int, status: ManagedJobStatus, reason: str,
                         **fields: Any) -> ManagedJobRecord:
        """Move the job to `status` (checked against `transitions`), with other field
        changes, and record why, atomically. The RUNNING clock and the start and end
        times follow the status."""
        record = self._require(job_id)
        transitions.check(record.status, status)
        now = time.time()
        reason = redact_urls(reason)
        if status == ManagedJobStatus.RUNNING and record.run_started_at is None:
            fields.setdefault("run_started_at", now)
            if record.started_at is None:
                fields.setdefault("started_at", now)
        elif status != ManagedJobStatus.RUNNING and record.run_started_at is not None:
            fields.setdefault("run_seconds", record.job_seconds(now))
            fields.setdefault("run_started_at", None)
        if status.is_final:
            fields.setdefault("ended_at", now)
        updated = dataclasses.replace(record, status=status, status_reason=reason,
                                      status_updated_at=now, **fields)
        row = updated.to_row()
        old = record.to_row()
        changed = [c for c in _COLUMNS if c != "id" and row[c] != old[c]]
        statements: list[tuple[str, Any]] = []
        if changed:
            statements.append((f"UPDATE managed_jobs SET {', '.join(f'{c} = ?' for c in changed)}"
                               " WHERE id = ?", [row[c] for c in changed] + [job_id]))
        if status != record.status:
            statements.append((_INSERT_EVENT, (now, job_id, str(record.status), str(status),
                                               reason)))
        if statements:
            await self._db.write(statements)
        self._records[job_id] = updated
        return updated

    async def add_event(self, job_id: int, reason: str) -> None:
        """A decision or finding that is not a status change."""
        status = str(self._require(job_id).status)
        await self._db.write([(_INSERT_EVENT, (time.time(), job_id, status, status,
                                               redact_urls(reason)))])

    async def events(self, job_id: int, *, after: int = 0, last: int | None = None
                     ) -> list[ManagedJobEvent]:
        """The job's events in order: those with an id above `after`, only the `last` N of
        them if given."""
        sql = "SELECT * FROM managed_job_events WHERE job_id = ? AND id > ?"
        params: list[Any] = [job_id, after]
        if last is None:
            rows = await self._db.fetchall(sql + " ORDER BY id", params)
        else:
            rows = await self._db.fetchall(sql + " ORDER BY id DESC LIMIT ?", [*params, last])
            rows.reverse()
        return [ManagedJobEvent(**dict(row)) for row in rows]

    def _require(self, job_id: int) -> ManagedJobRecord:
        record = self._records.get(job_id)
        if record is None:
            raise KeyError(job_id)
        return record
