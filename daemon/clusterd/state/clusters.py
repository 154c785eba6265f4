"""Live cluster records and their event history.

The daemon is the only writer, so the records are kept in memory and written through to the
database: reads (status, the hot path) never touch SQLite, and every change is committed before
the call returns, together with the event that explains it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from typing import Any

import anyio
import anyio.lowlevel
from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream

from clusterctl.protocol import ClusterStatus
from clusterd.providers.base import Placement
from clusterd.redact import redact_urls
from clusterd.state.db import Database, dumps, loads
from clusterd.state.handles import ClusterHandle
from clusterd.state.resources import (
    placement_from_text,
    placement_text,
    request_from_text,
    request_text,
)
from clusterd.tasks.spec import ResourceRequest

# Bound on the events table; the oldest beyond it are pruned on start and every so often.
EVENT_RETENTION = 20_000
# Records stamped as refreshed per step of the event loop.
STAMP_BATCH = 500


@dataclasses.dataclass(frozen=True)
class ClusterRecord:
    """A live cluster. Frozen: a change makes a new record (ClusterStore.update, set_status),
    so whatever holds one, such as the status views cached per record, never sees it change."""

    name: str
    provider: str
    cloud_name: str  # the name the provider knows it by; recorded before any create call
    status: ClusterStatus
    num_nodes: int
    requested_resources: ResourceRequest
    config_hash: str
    created_at: float
    status_updated_at: float
    status_reason: str = ""
    # Where the current (or last) launch attempt put it, and what its nodes have.
    launched_resources: Placement | None = None
    handle: ClusterHandle = dataclasses.field(default_factory=ClusterHandle)
    autostop_minutes: float | None = None
    autostop_down: bool = False
    autostop_wait_for: str = "jobs_and_ssh"
    autostop_set_at: float | None = None
    # When it falls due, as last computed from the agent's idleness; None while busy.
    autostop_deadline: float | None = None
    launched_at: float | None = None
    refreshed_at: float | None = None
    ever_up: bool = False
    launch_request_id: int | None = None
    # Who created it: None for its user; a managed job's `owner_tag` for a cluster that job
    # launched (only that job may reuse it, cancel its jobs or tear it down on its own).
    owner: str | None = None

    def refreshed(self, when: float) -> ClusterRecord:
        """This record stamped as refreshed at `when`: dataclasses.replace, without its
        per-field work (a refresh cycle stamps every cluster at once; for 10,000 that was
        the longest step the event loop took)."""
        stamped = object.__new__(ClusterRecord)
        stamped.__dict__.update(self.__dict__)
        stamped.__dict__["refreshed_at"] = when
        stamped.__dict__["_unstamped"] = self.unstamped
        return stamped

    @property
    def unstamped(self) -> ClusterRecord:
        """The record this one is a refresh stamp of (itself if it is not one): the same in
        every field but `refreshed_at`. A refresh cycle stamps every cluster, and most are
        otherwise unchanged; what is built from the other fields (status views) is kept."""
        unstamped: ClusterRecord = self.__dict__.get("_unstamped", self)
        return unstamped

    def to_row(self) -> dict[str, Any]:
        row = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        row["status"] = str(self.status)
        row["requested_resources"] = request_text(self.requested_resources)
        row["launched_resources"] = (
            None if self.launched_resources is None else placement_text(self.launched_resources)
        )
        handle = self.handle.to_json()
        row["handle"] = None if handle is None else dumps(handle)
        row["autostop_down"] = int(self.autostop_down)
        row["ever_up"] = int(self.ever_up)
        return row

    @classmethod
    def from_row(cls, row: Any) -> ClusterRecord:
        values = dict(row)
        values["status"] = ClusterStatus(values["status"])
        values["requested_resources"] = request_from_text(values["requested_resources"])
        values["launched_resources"] = placement_from_text(values["launched_resources"])
        values["handle"] = ClusterHandle.from_json(loads(values["handle"]), values["provider"])
        values["autostop_down"] = bool(values["autostop_down"])
        values["ever_up"] = bool(values["ever_up"])
        return cls(**values)


@dataclasses.dataclass(frozen=True)
class ClusterEvent:
    id: int
    ts: float
    cluster: str
    kind: str
    from_status: str | None
    to_status: str | None
    reason: str
    request_id: int | None

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_COLUMNS = [f.name for f in dataclasses.fields(ClusterRecord)]
_INSERT_EVENT = (
    "INSERT INTO cluster_events (ts, cluster, kind, from_status, to_status, reason, request_id)"
    " VALUES (?, ?, ?, ?, ?, ?, ?)"
)


class ClusterStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._records: dict[str, ClusterRecord] = {}
        self._event_listeners: set[MemoryObjectSendStream[ClusterEvent]] = set()

    async def load(self) -> None:
        rows = await self._db.fetchall("SELECT * FROM clusters")
        self._records = {row["name"]: ClusterRecord.from_row(row) for row in rows}
        await self.prune_events()

    def get(self, name: str) -> ClusterRecord | None:
        return self._records.get(name)

    def all(self) -> list[ClusterRecord]:
        return sorted(self._records.values(), key=lambda r: r.created_at)

    async def insert(self, record: ClusterRecord, reason: str, request_id: int | None) -> None:
        """Record a new cluster (its intent) and the event that created it."""
        if record.name in self._records:
            raise KeyError(f"cluster {record.name} already exists")
        row = record.to_row()
        placeholders = ", ".join("?" for _ in _COLUMNS)
        event = (record.created_at, record.name, "status", None, str(record.status),
                 redact_urls(reason), request_id)
        event_id = await self._db.write(
            [
                (f"INSERT INTO clusters ({', '.join(_COLUMNS)}) VALUES ({placeholders})",
                 [row[c] for c in _COLUMNS]),
                (_INSERT_EVENT, event),
            ]
        )
        self._records[record.name] = record
        self._publish(event_id, *event)

    async def update(self, name: str, **fields: Any) -> ClusterRecord:
        """Change fields other than the status (use `set_status` for that)."""
        record = self._require(name)
        if "status" in fields:
            raise ValueError("use set_status to change a cluster's status")
        updated = dataclasses.replace(record, **fields)
        row = updated.to_row()
        assignments = ", ".join(f"{key} = ?" for key in fields)
        await self._db.write(
            [(f"UPDATE clusters SET {assignments} WHERE name = ?",
              [row[key] for key in fields] + [name])]
        )
        self._records[name] = updated
        return updated

    async def mark_refreshed(self, names: list[str], when: float) -> None:
        """Stamp many clusters as refreshed, in one transaction (a cycle's bookkeeping must
        not cost a commit per cluster)."""
        present = [n for n in names if n in self._records]
        if not present:
            return
        await self._db.write_many("UPDATE clusters SET refreshed_at = ? WHERE name = ?",
                                  [(when, name) for name in present])
        for start in range(0, len(present), STAMP_BATCH):
            if start:
                await anyio.lowlevel.checkpoint()  # thousands of stamps: requests go between
            for name in present[start:start + STAMP_BATCH]:
                record = self._records.get(name)
                if record is not None:
                    self._records[name] = record.refreshed(when)

    async def set_status(
        self,
        name: str,
        status: ClusterStatus,
        reason: str,
        request_id: int | None = None,
        **fields: Any,
    ) -> ClusterRecord:
        """Move a cluster to `status`, with other field changes, and record why, atomically."""
        record = self._require(name)
        now = time.time()
        reason = redact_urls(reason)
        updated = dataclasses.replace(
            record, status=status, status_reason=reason, status_updated_at=now, **fields
        )
        if status == ClusterStatus.UP:
            updated = dataclasses.replace(updated, ever_up=True)
        row = updated.to_row()
        changed = [c for c in _COLUMNS if c != "name" and row[c] != record.to_row()[c]]
        statements: list[tuple[str, Any]] = []
        if changed:
            assignments = ", ".join(f"{c} = ?" for c in changed)
            statements.append(
                (f"UPDATE clusters SET {assignments} WHERE name = ?",
                 [row[c] for c in changed] + [name])
            )
        event: tuple[Any, ...] | None = None
        if status != record.status:
            event = (now, name, "status", str(record.status), str(status), reason, request_id)
            statements.append((_INSERT_EVENT, event))
        if statements:
            event_id = await self._db.write(statements)
            if event is not None:
                self._publish(event_id, *event)
        self._records[name] = updated
        return updated

    async def remove(self, name: str, reason: str, request_id: int | None = None) -> None:
        """The cluster is terminated: its record leaves the live table, its events stay.
        The record leaves memory before the write, so of two removals at once one raises
        KeyError, and the cluster gets one TERMINATED event, not two."""
        record = self._records.pop(name, None)
        if record is None:
            raise KeyError(name)
        event = (time.time(), name, "status", str(record.status),
                 str(ClusterStatus.TERMINATED), redact_urls(reason), request_id)
        try:
            event_id = await self._db.write(
                [("DELETE FROM clusters WHERE name = ?", [name]), (_INSERT_EVENT, event)]
            )
        except BaseException:
            self._records.setdefault(name, record)  # not removed after all
            raise
        self._publish(event_id, *event)

    async def add_event(
        self, name: str, kind: str, reason: str, request_id: int | None = None
    ) -> None:
        """An event that is not a status change (a decision, a finding)."""
        record = self._records.get(name)
        status = str(record.status) if record else None
        event = (time.time(), name, kind, status, status, redact_urls(reason), request_id)
        event_id = await self._db.write([(_INSERT_EVENT, event)])
        self._publish(event_id, *event)

    async def events(self, cluster: str | None, limit: int) -> list[ClusterEvent]:
        """The newest `limit` events (of one cluster, or all), oldest first."""
        where, params = ("WHERE cluster = ?", [cluster]) if cluster else ("", [])
        rows = await self._db.fetchall(
            f"SELECT * FROM cluster_events {where} ORDER BY id DESC LIMIT ?", [*params, limit]
        )
        return [ClusterEvent(**dict(row)) for row in reversed(rows)]

    async def has_event(self, cluster: str, kind: str, since: float) -> bool:
        """Whether the cluster has an event of `kind` at or after `since` (however many
        other events came after it)."""
        rows = await self._db.fetchall(
            "SELECT 1 FROM cluster_events WHERE cluster = ? AND kind = ? AND ts >= ? LIMIT 1",
            [cluster, kind, since])
        return bool(rows)

    async def prune_events(self) -> None:
        await self._db.write(
            [("DELETE FROM cluster_events WHERE id <= (SELECT MAX(id) FROM cluster_events) - ?",
              [EVENT_RETENTION])]
        )

    @contextlib.contextmanager
    def subscribe(self) -> Iterator[MemoryObjectReceiveStream[ClusterEvent]]:
        """New events as they are recorded, from the moment this is entered until it is left.
        A listener that falls 1000 events behind is dropped (its stream ends)."""
        send, receive = anyio.create_memory_object_stream[ClusterEvent](1000)
        self._event_listeners.add(send)
        try:
            yield receive
        finally:
            self._event_listeners.discard(send)
            send.close()
            receive.close()

    def _publish(self, event_id: int | None, *event: Any) -> None:
        if not self._event_listeners:
            return
        record = ClusterEvent(event_id or 0, *event)
        for listener in list(self._event_listeners):
            try:
                listener.send_nowait(record)
            except (anyio.WouldBlock, anyio.BrokenResourceError, anyio.ClosedResourceError):
                # A listener too slow to keep 1000 events is dropped rather than slowing state.
                self._event_listeners.discard(listener)
                listener.close()

    def _require(self, name: str) -> ClusterRecord:
        record = self._records.get(name)
        if record is None:
            raise KeyError(name)
        return record

    def names(self) -> Iterable[str]:
        return self._records.keys()

    def count(self) -> int:
        return len(self._records)
