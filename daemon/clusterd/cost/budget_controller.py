"""The budget controller: one object per configured budget (the account's, key "*", and each
provider's, keyed by its name) on the controller engine (clusterd.control).

Intent: the budget as the config file says it now, and its recorded state this month
(budget_store.py). Observe: the month's spend, the burn rate and the clusters spending, from
the `SpendMeter` (the ledger). Step: budget.decide, pure; nothing to do is a `Wait`, the
driver's lasting watch. Act: each decision is recorded (with its event) before it is acted on:

* warn: the level WARNED; its text is a notice on every `clusterctl` command (the hello).
* act: the level EXCEEDED, not yet acted; then, with `action: stop`, every cluster spending
  on the budget's provider(s) is stopped where its provider can stop, else torn down; with
  `down`, torn down; a managed job's cluster is never stopped under it: the job is cancelled
  (its own teardown follows). Only then is `acted` recorded, so a daemon killed in between
  acts again on restart (on what still spends). From EXCEEDED on, new nodes are refused
  (`refusal`, checked by the provisioner before each create) until the budget is raised.
* all-clear: back to CLEAR, when the budget was raised above the spend or a month began.

The drivers poll (`poll_s`). The config file is watched (one stat every `watch_s`): an
edit that changes the budgets wakes every driver (control.Engine.wake), so a raised budget
clears at once, a budget added gets its driver, and one removed stops its driver at its next
step. The launch's refusal does not wait for that either: a budget whose amount differs from
the one its level was recorded at is measured afresh, against the config as it is now.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc

from clusterctl.protocol import NOTICE_BUDGET, NOTICE_ERROR, NOTICE_WARN, Notice, ProtocolError
from clusterd import log
from clusterd.control import Action, Controller, Engine
from clusterd.cost.budget import (
    Budget,
    BudgetAction,
    BudgetState,
    Decision,
    Level,
    Observed,
    SpendMeter,
    decide,
    describe,
    level_in,
    measure,
    month_of,
    month_start,
    refusal,
)
from clusterd.cost.budget_store import BudgetStore
from clusterd.providers.base import BlockScope, ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.state.clusters import ClusterStore

logger = log.get("clusterd.budget")

MANAGED_OWNER = "managed-job:"  # a managed job's clusters' owner tag (managed/store.py)


class ClusterActions(Protocol):
    """What the controller does to clusters, through the services users' commands use."""

    async def stop(self, cluster: str, reason: str) -> None: ...

    async def down(self, cluster: str, reason: str) -> None: ...

    async def cancel_managed_job(self, job_id: int, reason: str) -> None: ...


@dataclasses.dataclass(frozen=True)
class BudgetIntent:
    budget: Budget
    state: BudgetState


@dataclasses.dataclass(frozen=True)
class _Decided(Action):
    text: str
    seen: Observed  # what the decision was made on (recorded with it)


class Warn(_Decided):
    pass


class Exceed(_Decided):
    pass


class Clear(_Decided):
    pass


@dataclasses.dataclass(frozen=True)
class Wait(Action):
    """Nothing to do: look again after a poll."""

    lasting = True


class BudgetController(Controller[str, BudgetIntent, Observed]):
    def __init__(self, budgets: Callable[[], tuple[Budget, ...]], store: BudgetStore,
                 meter: SpendMeter, clusters: ClusterStore, providers: ProviderRegistry,
                 actions: ClusterActions, config_path: str, *, poll_s: float = 30.0,
                 watch_s: float = 1.0, clock: Callable[[], float] = time.time) -> None:
        self._budgets = budgets
        self._store = store
        self._meter = meter
        self._clusters = clusters
        self._providers = providers
        self._actions = actions
        self._config_path = config_path
        self._poll_s = poll_s
        self._watch_s = watch_s
        self._clock = clock
        self._engine: Engine[str, BudgetIntent, Observed] = Engine(self, "budget")

    def configured(self) -> dict[str, Budget]:
        return {b.key: b for b in self._budgets()}

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        seen = self.configured()
        async with anyio.create_task_group() as group:
            await group.start(self._engine.run, list(seen))
            task_status.started()
            while True:  # the config watched: a change wakes the drivers, new ones start
                await anyio.sleep(self._watch_s)
                now = self.configured()
                if now != seen:
                    logger.info("budgets changed in the config", budgets=sorted(now))
                    seen = now
                    self._engine.wake()
                for key in now:
                    self._engine.spawn(key)

    # -- what others ask ----------------------------------------------------------------

    def _current(self) -> list[tuple[Budget, BudgetState]]:
        month = month_of(self._clock())
        found = []
        for key, budget in self.configured().items():
            state = self._store.get(key, month)
            if state.month == month:
                found.append((budget, state))
        return found

    def notices(self) -> list[Notice]:
        """A line per budget past its warning this month (every clusterctl command says it)."""
        return [Notice(state.text,
                       NOTICE_ERROR if state.level == Level.EXCEEDED else NOTICE_WARN,
                       NOTICE_BUDGET)
                for _, state in self._current() if state.level != Level.CLEAR]

    async def refusal(self, provider: str) -> ProvisionError | None:
        """Why new nodes on `provider` are refused (a budget exceeded), or None. The
        account's budget refuses everywhere (FATAL: no failover); a provider's, that
        provider only (failover goes on elsewhere). Read against the config as it is now:
        an exceeded budget whose amount was changed since (raised, say) is measured again,
        and refuses only if it is still exceeded (its driver is woken to record the clear)."""
        for budget, state in self._current():
            if state.level != Level.EXCEEDED or budget.provider not in (None, provider):
                continue
            spent = state.spent
            if budget.monthly != state.monthly_at_level:
                spent = await self._meter.spend(month_start(self._clock()), None,
                                                budget.provider)
                if spent < budget.monthly:
                    self._engine.wake()
                    continue
            return ProvisionError(
                refusal(budget, spent, self._config_path),
                BlockScope.FATAL if budget.provider is None else BlockScope.PROVIDER,
                "see docs/budgets.md")
        return None

    async def standing(self, provider: str | None) -> list[dict[str, object]]:
        """Each budget that counts a launch on `provider` (the account's, and that
        provider's own): its month's spend now, what is left, its level and what it says
        (for `launch --dryrun`)."""
        now = self._clock()
        found: list[dict[str, object]] = []
        for budget in self.configured().values():
            if budget.provider not in (None, provider):
                continue
            seen = await measure(self._meter, budget.provider, now)
            level = level_in(self._store.get(budget.key, seen.month), seen.month)
            found.append({
                "budget": budget.key, "label": budget.label(), "monthly": budget.monthly,
                "spent": seen.spent, "left": max(0.0, budget.monthly - seen.spent),
                "level": str(level), "action": str(budget.action),
                "says": describe(budget, seen)})
        return found

    # -- the engine's Controller ----------------------------------------------------------

    def intent(self, key: str) -> BudgetIntent | None:
        budget = self.configured().get(key)
        if budget is None:
            return None  # no longer configured: its driver stops
        return BudgetIntent(budget, self._store.get(key, month_of(self._clock())))

    async def observe(self, intent: BudgetIntent) -> Observed:
        return await measure(self._meter, intent.budget.provider, self._clock(),
                             spenders=True)

    def step(self, intent: BudgetIntent, observed: Observed) -> Action | None:
        found = decide(intent.budget, intent.state, observed)
        if found is None:
            return Wait()
        kind = {Decision.WARN: Warn, Decision.ACT: Exceed, Decision.ALL_CLEAR: Clear}
        return kind[found.decision](found.text, observed)

    async def act(self, intent: BudgetIntent, action: Action) -> None:
        budget = intent.budget
        match action:
            case Wait():
                await self._engine.pause(self._poll_s)
            case Warn(text, seen):
                logger.warning("budget warning", budget=budget.key, text=text)
                await self._record(budget, seen, Level.WARNED, text, "warn", acted=False)
            case Exceed(text, seen):
                logger.warning("budget exceeded", budget=budget.key, text=text)
                # The decision first: from here new nodes are refused, and a restart acts.
                await self._record(budget, seen, Level.EXCEEDED, text, "exceeded",
                                   acted=False)
                done = await self._take_action(budget, seen.spenders, text)
                await self._record(budget, seen, Level.EXCEEDED, f"{text}; {done}", "acted",
                                   acted=True)
            case Clear(text, seen):
                logger.info("budget clear", budget=budget.key, text=text)
                await self._record(budget, seen, Level.CLEAR, text, "all-clear", acted=False)
            case _:
                raise TypeError(f"not a budget's action: {action!r}")

    async def failed(self, key: str, error: Exception) -> None:
        logger.error("budget driver failed", budget=key, exc_info=error)

    async def _record(self, budget: Budget, seen: Observed, level: Level, text: str,
                      kind: str, *, acted: bool) -> None:
        await self._store.put(BudgetState(budget.key, seen.month, level, budget.monthly, acted,
                                          seen.spent, text), kind)

    async def _take_action(self, budget: Budget, spenders: tuple[str, ...], text: str) -> str:
        """Act on the clusters that spend; says what was done (for the record and events)."""
        refused = "new launches refused until the budget is raised"
        if budget.action == BudgetAction.WARN or not spenders:
            return refused
        reason = f"{budget.label()} exceeded ({budget.action})"
        done: list[str] = []
        for name in spenders:
            record = self._clusters.get(name)
            if record is None:
                continue
            owner = record.owner or ""
            if owner.startswith(MANAGED_OWNER):
                job = int(owner[len(MANAGED_OWNER):])
                await self._actions.cancel_managed_job(job, reason)
                done.append(f"managed job {job} cancelled")
            elif budget.action == BudgetAction.STOP and self._can_stop(record.provider):
                await self._actions.stop(name, reason)
                done.append(f"{name} stopped")
            else:
                await self._actions.down(name, reason)
                done.append(f"{name} torn down" + ("" if budget.action == BudgetAction.DOWN
                                                   else " (its provider cannot stop)"))
        return ", ".join([*done, refused])

    def _can_stop(self, provider: str) -> bool:
        try:
            return self._providers.get(provider).can_stop
        except ProtocolError:  # a provider no longer offered: down is what it can do
            return False
