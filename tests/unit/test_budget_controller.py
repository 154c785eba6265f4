"""The budget controller on a real state database, the scripted provider's cluster services,
and a SpendMeter made here: a real meter computing spend from intervals the test gives it.
A budget crossed stops what spends and refuses new nodes until it is raised; a decision
recorded before a kill -9 is acted on by the next daemon; the warning is a notice."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ClusterStatus, ProtocolError
from clusterd.cost.budget import Budget, BudgetAction, BudgetState, Level, month_of
from clusterd.cost.budget_controller import BudgetController
from clusterd.cost.budget_store import BudgetStore
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.plan import LaunchRequest
from clusterd.state.db import Database
from clusterd.tasks.spec import TaskSpec
from tests.scripted_provider import Services, build_services

pytestmark = pytest.mark.anyio

MONTH = datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC).timestamp()


@dataclasses.dataclass
class Interval:
    cluster: str
    provider: str
    start: float
    end: float | None
    per_hour: float


@dataclasses.dataclass
class IntervalMeter:
    """Spend from node intervals at a price per hour; open ones accrue to `now`."""

    clock: Callable[[], float]
    intervals: list[Interval] = dataclasses.field(default_factory=list)

    def _of(self, provider: str | None) -> list[Interval]:
        return [i for i in self.intervals if provider in (None, i.provider)]

    async def spend(self, since: float, until: float | None = None,
                    provider: str | None = None) -> float:
        until = self.clock() if until is None else until
        return sum(max(0.0, min(i.end or self.clock(), until) - max(i.start, since))
                   * i.per_hour / 3600 for i in self._of(provider))

    async def burn_rate(self, provider: str | None = None) -> float:
        return sum(i.per_hour for i in self._of(provider) if i.end is None)

    async def spenders(self, provider: str | None = None) -> list[str]:
        return [i.cluster for i in self._of(provider) if i.end is None]


class ServiceActions:
    """The controller's actions through the cluster services, as the daemon's are."""

    def __init__(self, bed: Services) -> None:
        self.bed = bed
        self.cancelled: list[int] = []

    async def stop(self, cluster: str, reason: str) -> None:
        await self.bed.clusters.stop(self.bed.request("stop", cluster), cluster, reason=reason)

    async def down(self, cluster: str, reason: str) -> None:
        await self.bed.clusters.down(self.bed.request("down", cluster), cluster, False,
                                     reason=reason)

    async def cancel_managed_job(self, job_id: int, reason: str) -> None:
        self.cancelled.append(job_id)


@dataclasses.dataclass
class Bed:
    services: Services
    store: BudgetStore
    meter: IntervalMeter
    actions: ServiceActions
    budgets: list[Budget]
    now: list[float]

    def controller(self, poll_s: float = 0.005, watch_s: float = 0.005) -> BudgetController:
        registry = ProviderRegistry([self.services.provider])
        controller = BudgetController(lambda: tuple(self.budgets), self.store, self.meter,
                                      self.services.store, registry, self.actions,
                                      "/cfg.yaml", poll_s=poll_s, watch_s=watch_s,
                                      clock=lambda: self.now[0])
        self.services.provisioner.refusal = controller.refusal
        return controller


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Bed:
    services = await build_services(db, tmp_path)
    store = BudgetStore(db)
    await store.load()
    now = [MONTH + 3600.0]
    return Bed(services, store, IntervalMeter(lambda: now[0]), ServiceActions(services), [],
               now)


async def up(bed: Bed, name: str, per_hour: float, since: float) -> None:
    await bed.services.clusters.launch(bed.services.request("launch", name),
                                       LaunchRequest(name, TaskSpec()))
    bed.meter.intervals.append(Interval(name, "scripted", since, None, per_hour))


async def until(condition: Callable[[], object]) -> None:
    with anyio.fail_after(10):
        while not condition():
            await anyio.sleep(0.002)


@pytest.fixture
async def running(bed: Bed) -> AsyncIterator[Callable[[BudgetController], object]]:
    async with anyio.create_task_group() as group:
        async def start(controller: BudgetController) -> None:
            await group.start(controller.run)
        yield start  # type: ignore[misc]
        group.cancel_scope.cancel()


def level(bed: Bed, key: str = "*") -> BudgetState:
    return bed.store.get(key, month_of(bed.now[0]))


async def test_exceeding_stops_what_spends_and_refuses_launches_until_raised(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    await up(bed, "c", 1.0, MONTH)  # $1 spent by now
    bed.budgets[:] = [Budget(0.5, 0.8, BudgetAction.STOP)]
    controller = bed.controller()
    await running(controller)  # type: ignore[misc]
    await until(lambda: level(bed).acted)
    record = bed.services.store.get("c")
    assert record is not None and record.status == ClusterStatus.STOPPED
    assert "c stopped" in level(bed).text
    assert any("budget exceeded" in n.text and (n.level, n.kind) == ("error", "budget")
               for n in controller.notices())
    with pytest.raises(ProtocolError) as refused:
        await bed.services.clusters.launch(bed.services.request("launch", "d"),
                                           LaunchRequest("d", TaskSpec()))
    assert "the monthly budget of $0.5 is exceeded ($1.00 spent this month)" in (
        refused.value.message)
    assert "raise budget.monthly in /cfg.yaml" in refused.value.message
    assert bed.services.store.get("d") is None or not bed.services.provider.instances.get("d")
    # Raised: all clear, and launches go again.
    bed.budgets[:] = [Budget(5.0, 0.8, BudgetAction.STOP)]
    await until(lambda: level(bed).level == Level.CLEAR)
    assert await controller.refusal("scripted") is None and controller.notices() == []
    kinds = [kind for _, _, kind, _ in await bed.store.events("*")]
    assert kinds == ["exceeded", "acted", "all-clear"]


async def test_a_decision_recorded_before_a_kill_is_acted_on_after(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    await up(bed, "c", 2.0, MONTH)
    bed.budgets[:] = [Budget(1.0, 0.8, BudgetAction.DOWN, "scripted")]
    # The daemon recorded EXCEEDED and was killed before acting.
    await bed.store.put(BudgetState("scripted", month_of(bed.now[0]), Level.EXCEEDED, 1.0,
                                    False, 2.0, "exceeded"), "exceeded")
    reloaded = BudgetStore(bed.store._db)
    await reloaded.load()
    bed.store = reloaded
    await running(bed.controller())  # type: ignore[misc]
    await until(lambda: level(bed, "scripted").acted)
    assert bed.services.store.get("c") is None  # torn down (action: down)
    assert "c torn down" in level(bed, "scripted").text


async def test_warn_at_is_a_notice_with_the_projection(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    await up(bed, "c", 9.0, MONTH)  # $9 of $10 by now, $9/h
    bed.budgets[:] = [Budget(10.0, 0.8, BudgetAction.STOP)]
    controller = bed.controller()
    await running(controller)  # type: ignore[misc]
    await until(lambda: level(bed).level == Level.WARNED)
    (alert,) = controller.notices()
    notice = alert.text
    assert (alert.level, alert.kind) == ("warn", "budget")
    assert "$9.00 of $10 spent in 2026-12 (90%)" in notice
    assert "at this rate the budget is reached on 2026-12-01 01:06 UTC" in notice
    record = bed.services.store.get("c")
    assert record is not None and record.status == ClusterStatus.UP


async def test_a_managed_jobs_cluster_is_its_job_cancelled(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    await bed.services.clusters.launch(
        bed.services.request("launch", "job"),
        LaunchRequest("job", TaskSpec(), owner="managed-job:7"))
    bed.meter.intervals.append(Interval("job", "scripted", MONTH, None, 1.0))
    bed.budgets[:] = [Budget(0.5, 0.8, BudgetAction.STOP)]
    await running(bed.controller())  # type: ignore[misc]
    await until(lambda: level(bed).acted)
    assert bed.actions.cancelled == [7]
    assert "managed job 7 cancelled" in level(bed).text


async def exceeded(bed: Bed, running: Callable[[BudgetController], object], *,
                   watch_s: float) -> BudgetController:
    """A budget of $0.5 exceeded by a cluster that spent $1 (action: warn, so it runs on),
    its drivers polling once an hour: only a wake can make them look again."""
    await up(bed, "c", 1.0, MONTH)
    bed.budgets[:] = [Budget(0.5, 0.8, BudgetAction.WARN)]
    controller = bed.controller(poll_s=3600.0, watch_s=watch_s)
    await running(controller)  # type: ignore[misc]
    await until(lambda: level(bed).acted)
    return controller


async def test_a_launch_right_after_the_budget_is_raised_goes(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    # The config is watched only once an hour here: the launch's own check reads it.
    controller = await exceeded(bed, running, watch_s=3600.0)
    with pytest.raises(ProtocolError, match="exceeded"):
        await bed.services.clusters.launch(bed.services.request("launch", "d"),
                                           LaunchRequest("d", TaskSpec()))
    bed.budgets[:] = [Budget(5.0, 0.8, BudgetAction.WARN)]
    await bed.services.clusters.launch(bed.services.request("launch", "d"),
                                       LaunchRequest("d", TaskSpec()))
    record = bed.services.store.get("d")
    assert record is not None and record.status == ClusterStatus.UP
    # The check woke the drivers, which record the clear without waiting out their poll.
    await until(lambda: level(bed).level == Level.CLEAR)
    assert controller.notices() == []


async def test_a_raise_still_under_the_spend_refuses_with_the_spend_now(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    controller = await exceeded(bed, running, watch_s=3600.0)
    bed.now[0] += 3600  # another dollar spent since the level was recorded
    bed.budgets[:] = [Budget(1.5, 0.8, BudgetAction.WARN)]
    refused = await controller.refusal("scripted")
    assert refused is not None
    assert "the monthly budget of $1.5 is exceeded ($2.00 spent this month)" in refused.message


async def test_an_edited_config_wakes_the_drivers(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    # No launch asks: the watch of the config sees the raise, and the drivers (whose poll
    # is an hour) clear at once.
    await exceeded(bed, running, watch_s=0.005)
    bed.budgets[:] = [Budget(5.0, 0.8, BudgetAction.WARN)]
    await until(lambda: level(bed).level == Level.CLEAR)


async def test_the_standing_says_what_is_left(bed: Bed) -> None:
    await up(bed, "c", 1.0, MONTH)
    bed.budgets[:] = [Budget(10.0), Budget(4.0, provider="other")]
    (account,) = await bed.controller().standing("scripted")
    assert account["budget"] == "*" and account["left"] == pytest.approx(9.0)
    assert account["level"] == "clear" and "$1.00 of $10 spent" in str(account["says"])
    assert [b["budget"] for b in await bed.controller().standing("other")] == ["*", "other"]


async def test_dryrun_says_the_budgets_verdict(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    controller = await exceeded(bed, running, watch_s=3600.0)
    dry_run = bed.services.clusters.dry_run
    dry_run.budgets = controller
    plan = await dry_run.launch(LaunchRequest("d", TaskSpec()))
    assert plan["placement"] is None and plan["says"] == "a new cluster d: refused by a budget"
    assert "the monthly budget of $0.5 is exceeded ($1.00 spent" in plan["budget"]["refused"]
    (standing,) = plan["budget"]["budgets"]
    assert (standing["level"], standing["left"]) == ("exceeded", 0.0)
    bed.budgets[:] = [Budget(5.0, 0.8, BudgetAction.WARN)]  # raised: the launch would go
    plan = await dry_run.launch(LaunchRequest("d", TaskSpec()))
    assert plan["budget"]["refused"] is None and plan["placement"]["infra"] == "scripted/r1/r1-a"
    assert plan["budget"]["budgets"][0]["left"] == pytest.approx(4.0)
    assert bed.services.store.get("d") is None  # a dry run: nothing made


async def test_a_providers_budget_skips_its_places_in_the_plan(
        bed: Bed, running: Callable[[BudgetController], object]) -> None:
    await up(bed, "c", 1.0, MONTH)
    bed.budgets[:] = [Budget(0.5, 0.8, BudgetAction.WARN, "scripted")]
    controller = bed.controller(poll_s=3600.0)
    await running(controller)  # type: ignore[misc]
    await until(lambda: level(bed, "scripted").acted)
    bed.services.clusters.dry_run.budgets = controller
    plan = await bed.services.clusters.dry_run.launch(LaunchRequest("d", TaskSpec()))
    # Its only provider's budget is exceeded: nowhere left to go, said why.
    assert plan["placement"] is None
    assert plan["budget"]["skipped"][0]["provider"] == "scripted"
    assert "the scripted budget of $0.5 is exceeded" in plan["budget"]["refused"]
