"""Daemon-owned requests (clusterd.requests) over a real SQLite request store."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.redact import public_args, redact_urls
from clusterd.requests import MAX_BUFFERED_EVENTS, RequestManager, RunningRequest, StepLog
from clusterd.state.db import Database
from clusterd.state.requests import RequestState, RequestStore

pytestmark = pytest.mark.anyio


@pytest.fixture
async def store(tmp_path: Path) -> AsyncIterator[RequestStore]:
    db = Database(tmp_path / "state" / "clusterd.db")
    await db.open()
    try:
        yield RequestStore(db)
    finally:
        await db.close()


async def collect(request: RunningRequest, into: list[tuple[str, dict[str, Any]]]) -> None:
    async for item in request.follow():
        into.append(item)


def test_public_args_hides_secret_values() -> None:
    args = {"cluster": "dev", "envs": {"A": "1"}, "secrets": {"TOKEN": "hunter2", "KEY": "k"}}
    shown = public_args(args)
    assert shown == {"cluster": "dev", "envs": {"A": "1"}, "secrets": ["KEY", "TOKEN"]}
    assert args["secrets"] == {"TOKEN": "hunter2", "KEY": "k"}  # the input is not changed
    assert public_args({"secrets": "oops"}) == {"secrets": "<redacted>"}
    assert public_args({"cluster": "dev"}) == {"cluster": "dev"}


async def test_start_before_attach_is_refused(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        return {}

    with pytest.raises(ProtocolError) as info:
        await manager.start("launch", "dev", {}, work)
    assert info.value.code == ErrorCode.SHUTTING_DOWN
    assert await store.recent() == []


async def test_follow_replays_then_streams_live_and_ends(store: RequestStore) -> None:
    manager = RequestManager(store)
    gate = anyio.Event()

    async def work(request: RunningRequest) -> dict[str, Any]:
        await request.progress("provisioning", phase="provision")
        request.emit("log", {"data": b"early"})
        await gate.wait()
        await request.blocked("cluster dev is busy")
        request.emit("log", {"data": b"late"})
        return {"job_id": 3}

    seen: list[tuple[str, dict[str, Any]]] = []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            manager.attach(tg)
            request = await manager.start("launch", "dev", {"cluster": "dev"}, work)
            assert manager.get(request.id) is request
            assert [r.id for r in manager.running()] == [request.id]
            await wait_all_tasks_blocked()
            tg.start_soon(collect, request, seen)
            await wait_all_tasks_blocked()
            # Events from before the follower arrived are replayed.
            assert [name for name, _ in seen] == ["progress", "log"]
            assert not request.done.is_set()
            gate.set()
            await request.done.wait()
    assert [name for name, _ in seen] == ["progress", "log", "blocked", "log"]
    progress = seen[0][1]
    assert progress["phase"] == "provision"
    assert progress["message"] == "provisioning"
    assert progress["elapsed"] >= 0
    assert seen[1][1] == {"data": b"early"}
    assert seen[2][1] == {"message": "cluster dev is busy"}
    assert seen[3][1] == {"data": b"late"}
    assert request.outcome() == {"job_id": 3}
    assert manager.get(request.id) is None

    record = await store.get(request.id)
    assert record is not None
    assert record.status == RequestState.SUCCEEDED
    assert record.op == "launch"
    assert record.cluster == "dev"
    assert record.result == {"job_id": 3}
    assert record.error_code is None
    assert record.finished_at is not None
    # Its steps are kept (not the log), for a page or a follower after it is over; a
    # listing leaves them out.
    assert [name for name, _ in record.steps or []] == ["progress", "blocked"]
    assert record.steps and record.steps[0][1] == progress
    assert "steps" not in record.to_wire()
    listed = await store.recent()
    assert listed[0].steps is None


async def test_follow_after_done_replays_everything(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        for i in range(3):
            request.emit("n", {"i": i})
        return {}

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        request = await manager.start("exec", "dev", {}, work)
    assert request.done.is_set()
    seen: list[tuple[str, dict[str, Any]]] = []
    with anyio.fail_after(1):
        await collect(request, seen)
    assert seen == [("n", {"i": 0}), ("n", {"i": 1}), ("n", {"i": 2})]
    assert request.outcome() == {}


async def test_follow_skips_events_dropped_from_a_full_buffer(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        for i in range(MAX_BUFFERED_EVENTS + 5):
            request.emit("n", {"i": i})
        return {}

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        request = await manager.start("exec", "dev", {}, work)
    seen: list[tuple[str, dict[str, Any]]] = []
    with anyio.fail_after(1):
        await collect(request, seen)
    assert len(seen) == MAX_BUFFERED_EVENTS
    assert seen[0] == ("n", {"i": 5})
    assert seen[-1] == ("n", {"i": MAX_BUFFERED_EVENTS + 4})


async def test_outcome_raises_the_protocol_error_of_the_work(store: RequestStore) -> None:
    manager = RequestManager(store)
    error = ProtocolError(ErrorCode.CLUSTER_NOT_FOUND, "cluster dev does not exist", "hint")

    async def work(request: RunningRequest) -> dict[str, Any]:
        raise error

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        request = await manager.start("stop", "dev", {}, work)
    with pytest.raises(ProtocolError) as info:
        request.outcome()
    assert info.value is error
    record = await store.get(request.id)
    assert record is not None
    assert record.status == RequestState.FAILED
    assert record.error_code == "CLUSTER_NOT_FOUND"
    assert record.error_message == "cluster dev does not exist"
    assert record.result is None


async def test_crashing_work_is_internal_and_failed(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        raise KeyError("oops")

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        request = await manager.start("down", "dev", {}, work)
        # The task group (the daemon) keeps running: the crash stays in the request.
    with pytest.raises(ProtocolError) as info:
        request.outcome()
    assert info.value.code == ErrorCode.INTERNAL
    assert info.value.message == "down failed unexpectedly: 'oops'"
    record = await store.get(request.id)
    assert record is not None
    assert record.status == RequestState.FAILED
    assert record.error_code == "INTERNAL"
    assert record.error_message == "down failed unexpectedly: 'oops'"


async def test_stored_args_never_hold_secret_values(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        return {}

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        request = await manager.start(
            "launch", "dev", {"cluster": "dev", "secrets": {"TOKEN": "hunter2"}}, work
        )
    assert request.record.args == {"cluster": "dev", "secrets": ["TOKEN"]}
    (record,) = await store.recent()
    assert record.args == {"cluster": "dev", "secrets": ["TOKEN"]}
    rows = await store._db.fetchall("SELECT args FROM requests")
    assert "hunter2" not in rows[0]["args"]


async def test_shutdown_cancels_long_work_and_records_cancelled(store: RequestStore) -> None:
    manager = RequestManager(store)
    quick_done = anyio.Event()

    async def long_work(request: RunningRequest) -> dict[str, Any]:
        await anyio.sleep_forever()
        return {}

    async def quick_work(request: RunningRequest) -> dict[str, Any]:
        await quick_done.wait()
        return {"ok": True}

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            manager.attach(tg)
            long = await manager.start("launch", "a", {}, long_work)
            quick = await manager.start("stop", "b", {}, quick_work)
            await wait_all_tasks_blocked()
            quick_done.set()
            await manager.shutdown(0.05)
            assert long.done.is_set()
            with pytest.raises(ProtocolError) as info:
                await manager.start("exec", "a", {}, quick_work)
            assert info.value.code == ErrorCode.SHUTTING_DOWN
    assert manager.running() == []
    with pytest.raises(ProtocolError) as info:
        long.outcome()
    assert info.value.code == ErrorCode.SHUTTING_DOWN
    assert info.value.message == f"request {long.id} was cancelled"
    assert quick.outcome() == {"ok": True}

    by_id = {r.id: r for r in await store.recent()}
    assert set(by_id) == {long.id, quick.id}  # the refused exec left no row
    assert by_id[long.id].status == RequestState.CANCELLED
    assert by_id[long.id].error_code == "SHUTTING_DOWN"
    assert by_id[quick.id].status == RequestState.SUCCEEDED
    assert by_id[quick.id].result == {"ok": True}


async def test_request_cancelled_by_its_task_group_is_not_recorded_succeeded(
    store: RequestStore,
) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        await anyio.sleep_forever()
        return {}

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            manager.attach(tg)
            request = await manager.start("launch", "dev", {}, work)
            await wait_all_tasks_blocked()
            tg.cancel_scope.cancel()
    assert request.done.is_set()
    record = await store.get(request.id)
    assert record is not None
    assert record.status != RequestState.SUCCEEDED
    with pytest.raises(ProtocolError):
        request.outcome()


def test_task_yaml_text_is_stored_without_its_secrets() -> None:
    text = ("name: t\nsecrets:\n  API_KEY: hunter2-yaml\nenvs:\n  A: '1'\n  GIT_TOKEN: ghp-env\n"
            "workdir:\n  url: https://bob:pat-in-url@git.example.com/r.git\nrun: echo $A\n")
    shown = public_args({"yaml_text": text, "secrets": {"B": "hunter2-flag"},
                         "envs": {"GIT_TOKEN": "ghp-flag", "C": "3"},
                         "command": None, "source": "git clone https://x:y@h/r"})
    stored = json.dumps(shown)
    for value in ("hunter2-yaml", "ghp-env", "pat-in-url", "hunter2-flag", "ghp-flag", "x:y@"):
        assert value not in stored, value
    assert "API_KEY: <redacted>" in shown["yaml_text"] and "A: '1'" in shown["yaml_text"]
    assert shown["envs"] == {"GIT_TOKEN": "<redacted>", "C": "3"}
    assert shown["secrets"] == ["B"]
    plain = "run: echo hi  # no secrets here\n"
    assert public_args({"yaml_text": plain})["yaml_text"] == plain  # kept as written


def test_url_credentials_in_env_values_and_command_words_are_not_stored() -> None:
    shown = public_args({"envs": {"REPO": "https://u:TOKEN-env@host/x", "A": "1"},
                         "command": ["git", "clone", "https://TOKEN-word@host/x"],
                         "nested": {"url": "ssh://u:TOKEN-nested@h/x"}})
    assert "TOKEN" not in json.dumps(shown)
    assert shown["envs"] == {"REPO": "https://<redacted>@host/x", "A": "1"}
    assert shown["command"] == ["git", "clone", "https://<redacted>@host/x"]


def test_url_credentials_are_redacted_wherever_they_are() -> None:
    assert redact_urls("cloning https://u:p@h.com/r and ssh://tok@h/x, not a@b.c") == (
        "cloning https://<redacted>@h.com/r and ssh://<redacted>@h/x, not a@b.c")


async def test_a_warning_is_said_once_per_request(store: RequestStore) -> None:
    """Layers far below (a provider finding another clusterd's instances, at each listing)
    may find the same thing several times in one request: the user reads it once."""
    request = RunningRequest(await store.create("down", "dev", {}))
    assert await request.warn_once("2 instances left alone")
    assert not await request.warn_once("2 instances left alone")
    assert await request.warn_once("1 security group left alone")
    said = [data["message"] for name, data in request._events if name == "progress"]
    assert said == ["warning: 2 instances left alone", "warning: 1 security group left alone"]
    other = RunningRequest(await store.create("launch", "dev", {}))
    assert await other.warn_once("2 instances left alone")


async def test_a_failed_request_keeps_its_steps(store: RequestStore) -> None:
    manager = RequestManager(store)

    async def work(request: RunningRequest) -> dict[str, Any]:
        await request.progress("checking where dev can run", phase="placement")
        request.emit("job", {"cluster": "dev", "job_id": 4})
        raise ProtocolError(ErrorCode.RESOURCES_UNAVAILABLE, "no capacity")

    async with anyio.create_task_group() as tg:
        manager.attach(tg)
        await manager.start("launch", "dev", {}, work)
    (record,) = await store.recent()
    kept = await store.get(record.id)
    assert kept is not None and kept.status == RequestState.FAILED
    assert [(name, data.get("message", data.get("job_id"))) for name, data in kept.steps or []
            ] == [("progress", "checking where dev can run"), ("job", 4)]


def test_step_log_keeps_both_ends_and_says_what_it_left_out() -> None:
    steps = StepLog(each_end=3)
    steps.add("log", {"data": b"never kept"})
    for i in range(10):
        steps.add("progress", {"message": f"step {i}", "elapsed": float(i), "phase": ""})
    kept = [data["message"] for _, data in steps.steps()]
    assert kept == ["step 0", "step 1", "step 2", "(4 steps left out)", "step 7", "step 8",
                    "step 9"]
    few = StepLog(each_end=3)
    few.add("blocked", {"message": "busy"})
    assert few.steps() == [["blocked", {"message": "busy"}]]
