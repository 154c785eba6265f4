"""The daemon's side of issue 38's commands: `check` of some providers, `show_gpus` with a
count, `jobs_cancel` by name and `jobs_logs` of the newest job (handlers on a temporary
database, no Ray)."""

from __future__ import annotations

from typing import Any

import pytest

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterctl.protocol import ManagedJobStatus as S
from clusterd.managed.store import ManagedJobStore, SubmittedTask
from clusterd.providers.local import LocalProvider
from clusterd.providers.registry import ProviderRegistry
from clusterd.server.handlers import _with_count
from clusterd.server.managed_handlers import ManagedHandlers
from clusterd.state.db import Database
from tests.unit.test_providers import NewProvider, handlers_with

pytestmark = pytest.mark.anyio


async def test_check_asks_only_the_providers_named(tmp_path: Any) -> None:
    handlers = handlers_with(ProviderRegistry([LocalProvider(tmp_path), NewProvider()]))
    checked = await handlers.check(None, protocol.CheckArgs(providers=["NEW"]))  # type: ignore[arg-type]
    assert set(checked["providers"]) == {"new"} and checked["widgets"] == ["w1"]
    local = await handlers.check(None, protocol.CheckArgs(providers=["local"]))  # type: ignore[arg-type]
    assert set(local["providers"]) == {"local"} and "widgets" not in local
    with pytest.raises(ProtocolError) as unknown:
        await handlers.check(None, protocol.CheckArgs(providers=["gcp"]))  # type: ignore[arg-type]
    assert unknown.value.code == ErrorCode.INVALID_ARGUMENT


def test_a_count_keeps_instance_types_with_that_many_and_nodes_with_at_least() -> None:
    rows: list[dict[str, Any]] = [
        {"accelerator": "A100", "count": 1}, {"accelerator": "A100", "count": 8},
        {"accelerator": "A100", "count": 8, "node": "n1"},
        {"accelerator": "A100", "count": 4, "node": "n2"}]
    assert _with_count(rows, 8, "A100") == [rows[1], rows[2]]
    assert _with_count(rows, 2, "A100") == [rows[2], rows[3]]
    with pytest.raises(ProtocolError) as none:
        _with_count(rows[:2], 3, "A100")
    assert "3 of A100" in none.value.message and none.value.hint == "counts offered: 1, 8"


class Cancels:
    """The controller's cancel, recorded."""

    def __init__(self) -> None:
        self.calls: list[tuple[list[int], bool]] = []

    async def cancel(self, job_ids: list[int], cancel_all: bool) -> dict[str, Any]:
        self.calls.append((job_ids, cancel_all))
        return {"cancelled": job_ids, "already_finished": []}


async def jobs(db: Database, *names: str) -> ManagedJobStore:
    store = ManagedJobStore(db)
    for name in names:
        await store.insert(name, SubmittedTask.storable(command="echo hi"), "t")
    return store


async def test_cancel_by_name_is_the_one_unfinished_job_of_that_name(db: Database) -> None:
    store = await jobs(db, "train", "eval", "train")
    await store.set_status(1, S.STARTING, "launching a cluster")
    await store.set_status(1, S.FAILED_NO_RESOURCE, "no capacity")
    controller = Cancels()
    handlers = ManagedHandlers(controller, store, None)  # type: ignore[arg-type]
    result = await handlers.cancel(None, protocol.JobsCancelArgs(name="train"))  # type: ignore[arg-type]
    assert result["cancelled"] == [3] and controller.calls == [([3], False)]
    await store.insert("eval", SubmittedTask.storable(command="echo hi"), "t")
    with pytest.raises(ProtocolError) as several:
        await handlers.cancel(None, protocol.JobsCancelArgs(name="eval"))  # type: ignore[arg-type]
    assert several.value.code == ErrorCode.INVALID_ARGUMENT and "2, 4" in several.value.message
    with pytest.raises(ProtocolError) as nobody:
        await handlers.cancel(None, protocol.JobsCancelArgs(name="nope"))  # type: ignore[arg-type]
    assert nobody.value.code == ErrorCode.MANAGED_JOB_NOT_FOUND
    await store.set_status(3, S.CANCELLING, "cancel requested")
    await store.set_status(3, S.CANCELLED, "cancelled")
    ended = await handlers.cancel(None, protocol.JobsCancelArgs(name="train"))  # type: ignore[arg-type]
    assert ended == {"cancelled": [], "already_finished": [1, 3]}
    with pytest.raises(ProtocolError):
        await handlers.cancel(None, protocol.JobsCancelArgs(name="train", all=True))  # type: ignore[arg-type]
    assert len(controller.calls) == 1


async def test_jobs_logs_without_an_id_is_the_newest_job(db: Database) -> None:
    store = await jobs(db)
    handlers = ManagedHandlers(None, store, None)  # type: ignore[arg-type]
    with pytest.raises(ProtocolError) as none:
        handlers._newest()
    assert none.value.code == ErrorCode.MANAGED_JOB_NOT_FOUND
    for name in ("a", "b"):
        await store.insert(name, SubmittedTask.storable(command="echo hi"), "t")
    assert handlers._newest() == 2
