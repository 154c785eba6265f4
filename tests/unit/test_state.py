"""The daemon's SQLite state: migrations, cluster records with events, request records."""

from __future__ import annotations

import dataclasses
import sqlite3
import threading
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from clusterctl.protocol import ClusterStatus
from clusterd.providers.base import Placement
from clusterd.providers.local import LocalHandle
from clusterd.state import ClusterRecord, ClusterStore, Database, RequestStore
from clusterd.state.clusters import ClusterEvent
from clusterd.state.db import MIGRATIONS, SCHEMA_VERSION, SchemaTooNew
from clusterd.state.handles import ClusterHandle, RuntimeHandle
from clusterd.state.requests import RequestState
from clusterd.tasks.spec import Infra, ResourceRequest, Resources

pytestmark = pytest.mark.anyio


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "state" / "clusterd.db"


@pytest.fixture
async def db(db_path: Path) -> AsyncIterator[Database]:
    database = Database(db_path)
    await database.open()
    try:
        yield database
    finally:
        await database.close()


def make_record(name: str = "dev", created_at: float = 1000.0, **fields: object) -> ClusterRecord:
    values: dict[str, object] = {
        "name": name,
        "provider": "local",
        "cloud_name": f"{name}-abc123",
        "status": ClusterStatus.INIT,
        "num_nodes": 2,
        "requested_resources": ResourceRequest(Resources(Infra("local"), cpus=4.0,
                                                         ports=("22",))),
        "config_hash": "0123456789abcdef",
        "created_at": created_at,
        "status_updated_at": created_at,
    }
    values.update(fields)
    return ClusterRecord(**values)  # type: ignore[arg-type]


def user_version(path: Path) -> int:
    with sqlite3.connect(path) as conn:
        return int(conn.execute("PRAGMA user_version").fetchone()[0])


# --------------------------------------------------------------------------------------------
# Database


async def test_open_migrates_to_schema_version(db: Database, db_path: Path) -> None:
    assert SCHEMA_VERSION == len(MIGRATIONS) >= 1
    assert await db.schema_version() == SCHEMA_VERSION
    assert user_version(db_path) == SCHEMA_VERSION
    tables = {row["name"] for row in await db.fetchall(
        "SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert {"clusters", "cluster_events", "requests"} <= tables
    rows = await db.fetchall("PRAGMA journal_mode")
    assert rows[0][0] == "wal"


async def test_reopening_is_idempotent_and_keeps_data(db_path: Path) -> None:
    first = Database(db_path)
    await first.open()
    await first.write([("INSERT INTO requests (op, args, status, created_at) VALUES (?,?,?,?)",
                        ["ping", "{}", "RUNNING", 1.0])])
    await first.close()
    for _ in range(2):
        again = Database(db_path)
        await again.open()  # must not try to create the tables a second time
        try:
            assert await again.schema_version() == SCHEMA_VERSION
            rows = await again.fetchall("SELECT op FROM requests")
            assert [row["op"] for row in rows] == ["ping"]
        finally:
            await again.close()


async def test_conn_before_open_raises(db_path: Path) -> None:
    with pytest.raises(RuntimeError, match="database is not open"):
        Database(db_path).conn  # noqa: B018


async def test_newer_schema_is_refused(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    database = Database(db_path)
    try:
        with pytest.raises(SchemaTooNew) as info:
            await database.open()
        assert f"schema version {SCHEMA_VERSION + 1}" in str(info.value)
        assert "upgrade clusterd" in str(info.value)
    finally:
        await database.close()
    assert user_version(db_path) == SCHEMA_VERSION + 1  # left untouched


async def test_newer_schema_leaves_no_connection_thread(db_path: Path) -> None:
    db_path.parent.mkdir(parents=True)
    with sqlite3.connect(db_path) as conn:
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    before = set(threading.enumerate())
    database = Database(db_path)
    try:
        with pytest.raises(SchemaTooNew):
            await database.open()
        leftover = [t for t in threading.enumerate() if t not in before]
        for thread in leftover:
            thread.join(timeout=1)
        assert [t for t in leftover if t.is_alive() and not t.daemon] == []
    finally:
        await database.close()


async def test_failed_write_rolls_back_the_whole_transaction(db: Database) -> None:
    insert = ("INSERT INTO requests (op, args, status, created_at) VALUES (?,?,?,?)",
              ["a", "{}", "RUNNING", 1.0])
    with pytest.raises(sqlite3.IntegrityError):
        await db.write([insert, ("INSERT INTO requests (op) VALUES (?)", ["b"])])
    assert await db.fetchall("SELECT * FROM requests") == []
    assert await db.write([insert]) == 1


# --------------------------------------------------------------------------------------------
# ClusterStore


async def test_insert_records_and_writes_creation_event(db: Database) -> None:
    store = ClusterStore(db)
    record = make_record()
    await store.insert(record, "launch requested", request_id=5)
    assert store.get("dev") == record
    assert [r.name for r in store.all()] == ["dev"]
    (event,) = await store.events("dev", 10)
    assert event.cluster == "dev"
    assert event.kind == "status"
    assert event.from_status is None
    assert event.to_status == "INIT"
    assert event.reason == "launch requested"
    assert event.request_id == 5
    assert event.ts == record.created_at
    with pytest.raises(KeyError):
        await store.insert(make_record(), "again", None)
    assert len(await store.events("dev", 10)) == 1


async def test_status_changes_write_events_oldest_first(db: Database) -> None:
    store = ClusterStore(db)
    await store.insert(make_record(), "created", 1)
    handle = ClusterHandle(provider=LocalHandle("/state/local/dev-abc123"),
                           runtime=RuntimeHandle(ports={"gcs_port": 6379}, agent_token="t"))
    up = await store.set_status("dev", ClusterStatus.UP, "nodes ready", 1, handle=handle)
    assert up.status == ClusterStatus.UP
    assert up.ever_up is True
    assert up.status_reason == "nodes ready"
    assert up.handle == handle
    await store.update("dev", autostop_minutes=10.0, autostop_down=True)
    # Same status again: fields change, but no event.
    await store.set_status("dev", ClusterStatus.UP, "refreshed", None, refreshed_at=2000.0)
    await store.set_status("dev", ClusterStatus.STOPPED, "autostop", 2)
    await store.add_event("dev", "decision", "kept the nodes")

    events = await store.events("dev", 100)
    assert [(e.from_status, e.to_status, e.reason, e.request_id) for e in events] == [
        (None, "INIT", "created", 1),
        ("INIT", "UP", "nodes ready", 1),
        ("UP", "STOPPED", "autostop", 2),
        ("STOPPED", "STOPPED", "kept the nodes", None),
    ]
    assert [e.kind for e in events] == ["status", "status", "status", "decision"]
    assert [e.id for e in events] == sorted(e.id for e in events)
    # `limit` keeps the newest, still oldest first.
    assert [e.reason for e in await store.events("dev", 2)] == ["autostop", "kept the nodes"]

    record = store.get("dev")
    assert record is not None
    assert record.status == ClusterStatus.STOPPED
    assert record.ever_up is True
    assert record.autostop_minutes == 10.0
    assert record.autostop_down is True
    assert record.refreshed_at == 2000.0


async def test_update_refuses_status(db: Database) -> None:
    store = ClusterStore(db)
    await store.insert(make_record(), "created", None)
    with pytest.raises(ValueError, match="set_status"):
        await store.update("dev", status=ClusterStatus.UP)
    with pytest.raises(KeyError):
        await store.update("nope", num_nodes=3)
    with pytest.raises(KeyError):
        await store.set_status("nope", ClusterStatus.UP, "x")


async def test_remove_leaves_terminated_event_and_history(db: Database) -> None:
    store = ClusterStore(db)
    await store.insert(make_record(), "created", 1)
    await store.set_status("dev", ClusterStatus.UP, "ready", 1)
    await store.remove("dev", "down requested", 3)
    assert store.get("dev") is None
    assert list(store.names()) == []
    events = await store.events("dev", 100)
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, "INIT"), ("INIT", "UP"), ("UP", "TERMINATED"),
    ]
    assert events[-1].reason == "down requested"
    assert events[-1].request_id == 3
    assert await db.fetchall("SELECT * FROM clusters") == []
    # The history survives a reload too.
    reloaded = ClusterStore(db)
    await reloaded.load()
    assert reloaded.get("dev") is None
    assert len(await reloaded.events("dev", 100)) == 3


async def test_two_removals_at_once_make_one_terminated_event(db: Database) -> None:
    """A refresh that found a cluster's nodes gone and the request tearing it down may both
    remove it: one wins, the other learns the record is gone; one TERMINATED event."""
    store = ClusterStore(db)
    await store.insert(make_record(), "created", 1)
    outcomes: list[str] = []

    async def remove(reason: str) -> None:
        try:
            await store.remove("dev", reason)
            outcomes.append("removed")
        except KeyError:
            outcomes.append("already gone")

    async with anyio.create_task_group() as group:
        group.start_soon(remove, "refresh found no nodes left")
        group.start_soon(remove, "torn down")
    assert sorted(outcomes) == ["already gone", "removed"]
    events = await store.events("dev", 100)
    assert [e.to_status for e in events] == ["INIT", "TERMINATED"]


async def test_events_of_all_clusters(db: Database) -> None:
    store = ClusterStore(db)
    await store.insert(make_record("a", 1.0), "created a", None)
    await store.insert(make_record("b", 2.0), "created b", None)
    assert [e.cluster for e in await store.events(None, 10)] == ["a", "b"]
    assert [e.cluster for e in await store.events("b", 10)] == ["b"]
    assert [r.name for r in store.all()] == ["a", "b"]


async def test_records_persist_across_store_instances(db_path: Path) -> None:
    first_db = Database(db_path)
    await first_db.open()
    store = ClusterStore(first_db)
    await store.insert(make_record("dev"), "created", None)
    await store.set_status("dev", ClusterStatus.UP, "ready", None,
                           launched_resources=Placement("local", None, None, None, 4.0, 16.0),
                           launched_at=1001.5,
                           handle=ClusterHandle(provider=LocalHandle("/state/local/dev-abc123")))
    await store.update("dev", autostop_minutes=5.0, autostop_wait_for="jobs")
    await store.insert(make_record("other", 999.0), "created", None)
    expected = {r.name: r for r in store.all()}
    await first_db.close()

    second_db = Database(db_path)
    await second_db.open()
    try:
        reloaded = ClusterStore(second_db)
        assert reloaded.get("dev") is None  # nothing until load()
        await reloaded.load()
        assert {r.name: r for r in reloaded.all()} == expected
        dev = reloaded.get("dev")
        assert dev is not None
        assert dev.status is ClusterStatus.UP
        assert dev.ever_up is True
        assert dev.handle == ClusterHandle(provider=LocalHandle("/state/local/dev-abc123"))
        assert [r.name for r in reloaded.all()] == ["other", "dev"]
    finally:
        await second_db.close()


async def test_a_refresh_stamps_many_records_as_replace_would_and_keeps_them(
        db_path: Path) -> None:
    database = Database(db_path)
    await database.open()
    try:
        store = ClusterStore(database)
        for index in range(1200):  # more than a step's batch: stamped over several steps
            await store.insert(make_record(f"c{index}", 1000.0 + index), "created", None)
        before = {r.name: r for r in store.all()}
        await store.mark_refreshed([*before, "gone"], 2000.5)
        for name, old in before.items():
            stamped = store.get(name)
            assert stamped is not old  # a new record: views cached per record see a change
            assert stamped == dataclasses.replace(old, refreshed_at=2000.5)
            assert stamped.unstamped is old  # what views are built from did not change
        assert old.refreshed_at is None  # the old one is left as it was (frozen)
        reloaded = ClusterStore(database)
        await reloaded.load()
        assert {r.name: r.refreshed_at for r in reloaded.all()} == dict.fromkeys(before,
                                                                                 2000.5)
        await store.mark_refreshed([old.name], 2001.0)
        assert store.get(old.name).unstamped is old  # stamped again: still the same
        changed = await store.set_status(old.name, ClusterStatus.STOPPED, "stopped")
        assert changed.unstamped is changed  # any other change: a record of its own
    finally:
        await database.close()


async def test_subscribe_receives_events_published_after_subscribing(db: Database) -> None:
    store = ClusterStore(db)
    await store.insert(make_record("early"), "before anyone listened", None)
    received: list[ClusterEvent] = []

    async def listen() -> None:
        with store.subscribe() as live:
            async for event in live:
                received.append(event)
                if len(received) == 3:
                    break

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(listen)
            await wait_all_tasks_blocked()
            await store.insert(make_record("dev"), "created", 4)
            await store.set_status("dev", ClusterStatus.UP, "ready", 4)
            await store.remove("dev", "down", 5)
    assert [(e.cluster, e.from_status, e.to_status, e.reason) for e in received] == [
        ("dev", None, "INIT", "created"),
        ("dev", "INIT", "UP", "ready"),
        ("dev", "UP", "TERMINATED", "down"),
    ]
    # Published events carry the ids they were stored under.
    stored = await store.events("dev", 10)
    assert [e.id for e in received] == [e.id for e in stored]
    assert received == stored
    # The listener is gone once it stops iterating.
    assert store._event_listeners == set()


# --------------------------------------------------------------------------------------------
# RequestStore


async def test_request_store_create_finish_get_recent(db: Database) -> None:
    requests = RequestStore(db)
    first = await requests.create("launch", "dev", {"cluster": "dev"})
    second = await requests.create("ping", None, {})
    assert (first.id, second.id) == (1, 2)
    assert first.status == RequestState.RUNNING
    await requests.finish(first.id, RequestState.FAILED, error_code="LOCK_TIMEOUT",
                          error_message="gave up")
    record = await requests.get(first.id)
    assert record is not None
    assert record.status == RequestState.FAILED
    assert record.error_code == "LOCK_TIMEOUT"
    assert record.error_message == "gave up"
    assert record.args == {"cluster": "dev"}
    assert record.finished_at is not None
    assert await requests.get(99) is None
    assert [r.id for r in await requests.recent()] == [2, 1]
    assert [r.id for r in await requests.recent(limit=1)] == [2]


async def test_mark_interrupted_turns_running_into_interrupted(db: Database) -> None:
    requests = RequestStore(db)
    running = await requests.create("launch", "dev", {})
    done = await requests.create("stop", "dev", {})
    await requests.finish(done.id, RequestState.SUCCEEDED, result={"ok": True})
    also_running = await requests.create("exec", "dev", {})

    interrupted = await requests.mark_interrupted()
    assert sorted(r.id for r in interrupted) == [running.id, also_running.id]
    by_id = {r.id: r for r in await requests.recent()}
    assert by_id[running.id].status == RequestState.INTERRUPTED
    assert by_id[running.id].error_message == "clusterd stopped while it ran"
    assert by_id[running.id].finished_at is not None
    assert by_id[also_running.id].status == RequestState.INTERRUPTED
    assert by_id[done.id].status == RequestState.SUCCEEDED
    assert by_id[done.id].result == {"ok": True}
    assert await requests.mark_interrupted() == []
