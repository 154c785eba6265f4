"""The idle-cost guard on the control engine, over a real state database, the scripted
provider's cluster services and their real ledger: a cluster UP, idle and with no autostop
is warned of once (an event naming its cost, and a notice) after the configured time, until
it is busy again or given an autostop; a restarted daemon shows the notice again without a
second event. Idleness is what the test says the agent reports (when the stretch began);
times are real, and small."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.cost.idle_guard import (
    EVENT_KIND,
    Busy,
    IdleGuard,
    IdleIntent,
    IdleSeen,
    Warn,
    Watch,
    decide,
)
from clusterd.provision.plan import LaunchRequest
from clusterd.state.clusters import ClusterRecord
from clusterd.state.db import Database
from clusterd.tasks.spec import TaskSpec
from clusterd.user_config import parse
from tests.scripted_provider import Services, build_services

pytestmark = pytest.mark.anyio

AFTER_S = 0.3


@dataclasses.dataclass
class Bed:
    services: Services
    idle_since: dict[str, float | None]  # what each cluster's agent says (None: busy)
    after_s: list[float | None]
    asked: list[str] = dataclasses.field(default_factory=list)  # agents asked, in order

    async def idle_for(self, record: ClusterRecord) -> float | None:
        self.asked.append(record.name)
        since = self.idle_since.get(record.name)
        return None if since is None else time.time() - since

    def guard(self) -> IdleGuard:
        return IdleGuard(lambda: self.after_s[0], self.services.store,
                         self.services.clusters.ledger, self.idle_for, check_s=0.01)

    async def warnings(self, name: str = "c", limit: int = 100) -> list[str]:
        return [e.reason for e in await self.services.store.events(name, limit)
                if e.kind == EVENT_KIND]


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Bed:
    services = await build_services(db, tmp_path)
    await services.clusters.launch(services.request("launch", "c"), LaunchRequest("c", TaskSpec()))
    return Bed(services, {}, [AFTER_S])


@pytest.fixture
async def running() -> AsyncIterator[Callable[[IdleGuard], object]]:
    async with anyio.create_task_group() as group:
        async def start(guard: IdleGuard) -> None:
            await group.start(guard.run)
        yield start  # type: ignore[misc]
        group.cancel_scope.cancel()


async def until(condition: Callable[[], object]) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.005)


async def test_an_idle_cluster_is_warned_of_once_until_busy_again(
        bed: Bed, running: Callable[[IdleGuard], object]) -> None:
    guard = bed.guard()
    await running(guard)  # type: ignore[misc]
    bed.idle_since["c"] = time.time()
    began = time.monotonic()
    await until(guard.notices)
    assert time.monotonic() - began >= AFTER_S * 0.9  # not before it is due
    (alert,) = guard.notices()
    notice = alert.text
    assert (alert.level, alert.kind) == ("warn", "idle")
    assert notice.startswith("cluster c has been idle for 0 s with no autostop, at $1/h: $")
    assert "set one: clusterctl autostop c -i 30 (or clusterctl down c)" in notice
    assert await bed.warnings() == [notice]
    bed.idle_since["c"] = None  # a job: busy
    await until(lambda: not guard.notices())
    bed.idle_since["c"] = time.time()  # idle again: a new stretch, a new warning when due
    await until(guard.notices)
    assert len(await bed.warnings()) == 2


async def test_an_autostop_ends_the_notice_and_the_watch(
        bed: Bed, running: Callable[[IdleGuard], object]) -> None:
    guard = bed.guard()
    bed.idle_since["c"] = time.time() - 60  # idle a minute already
    await running(guard)  # type: ignore[misc]
    await until(guard.notices)
    await bed.services.store.update("c", autostop_minutes=30.0)
    assert guard.notices() == []  # at once: the notice is read against the record
    await until(lambda: not guard._engine.driving("c"))
    assert guard.guarded() == []


@pytest.mark.parametrize("events_between", [0, 200])
async def test_a_restart_in_a_warned_stretch_notices_again_without_a_second_event(
        bed: Bed, events_between: int) -> None:
    bed.idle_since["c"] = time.time() - 60
    for daemon in range(2):  # a daemon, then the next one after a kill
        guard = bed.guard()
        async with anyio.create_task_group() as group:
            await group.start(guard.run)
            await until(guard.notices)
            group.cancel_scope.cancel()
        if daemon == 0:  # a busy event log: the warning is far from the newest events
            for n in range(events_between):
                await bed.services.store.add_event("c", "provision", f"event {n}")
    assert len(await bed.warnings(limit=1000)) == 1


async def test_off_in_the_config_guards_nothing(
        bed: Bed, running: Callable[[IdleGuard], object]) -> None:
    bed.after_s[0] = None
    guard = bed.guard()
    assert guard.guarded() == []
    bed.idle_since["c"] = time.time() - 3600
    await running(guard)  # type: ignore[misc]
    with anyio.move_on_after(0.2):  # the run loop looks every 10 ms: it must find nothing
        await until(guard.notices)
    assert guard.notices() == [] and await bed.warnings() == []


async def test_a_free_cluster_is_not_warned_of_nor_its_agent_asked(
        bed: Bed, running: Callable[[IdleGuard], object]) -> None:
    await bed.services.clusters.ledger.ended("c")  # nothing open: it costs nothing now
    bed.idle_since["c"] = time.time() - 3600
    guard = bed.guard()
    await running(guard)  # type: ignore[misc]
    await until(lambda: guard._engine.driving("c"))
    with anyio.move_on_after(0.2):
        await until(guard.notices)
    assert bed.asked == [] and await bed.warnings() == []


def seen(idle_s: float | None, *, per_hour: float = 1.0, warned: bool = False,
         noticed: bool = False) -> IdleSeen:
    return IdleSeen(idle_s, per_hour, 2.5, warned, noticed)


async def test_the_step_warns_when_due_and_only_of_what_costs(bed: Bed) -> None:
    record = bed.services.store.get("c")
    assert record is not None
    intent = IdleIntent(record, 100.0)
    assert decide(intent, seen(40.0), 30.0) == Watch(30.0)
    assert decide(intent, seen(90.0), 30.0) == Watch(10.0)  # looks again when it falls due
    warn = decide(intent, seen(100.0), 30.0)
    assert isinstance(warn, Warn) and warn.event and "$2.50 so far" in warn.text
    restarted = decide(intent, seen(150.0, warned=True), 30.0)
    assert isinstance(restarted, Warn) and not restarted.event
    assert decide(intent, seen(150.0, warned=True, noticed=True), 30.0) == Watch(30.0)
    assert decide(intent, seen(None, noticed=True), 30.0) == Busy()
    assert decide(intent, seen(500.0, per_hour=0.0), 30.0) == Watch(30.0)  # free: no warning


@pytest.mark.parametrize(("text", "seconds"), [
    ("", 7200.0), ("cost: {idle_warning_after: 90s}", 90.0),
    ("cost: {idle_warning_after: 30m}", 1800.0), ("cost: {idle_warning_after: 1d}", 86400.0),
    ("cost: {idle_warning_after: 5}", 300.0), ("cost: {idle_warning_after: off}", None),
    ("cost: {idle_warning_after: 0}", None),
])
def test_the_config_says_when_to_warn(text: str, seconds: float | None) -> None:
    assert parse(Path("c.yaml"), text).idle_warning_after_s == seconds


@pytest.mark.parametrize(("text", "key"), [
    ("cost: 2h", "cost"), ("cost: {idle: 2h}", "cost.idle"),
    ("cost: {idle_warning_after: -1}", "cost.idle_warning_after"),
    ("cost: {idle_warning_after: 2w}", "cost.idle_warning_after"),
    ("cost: {idle_warning_after: nanh}", "cost.idle_warning_after"),
])
def test_a_bad_idle_warning_value_names_its_key(text: str, key: str) -> None:
    with pytest.raises(ProtocolError, match=f": {key}: "):
        parse(Path("c.yaml"), text)
