"""The loop every desired-state controller runs: one driver per object (see the package's
docstring for the contract a controller fills in)."""

from __future__ import annotations

import abc
from collections.abc import Hashable, Iterable
from typing import ClassVar, Generic, TypeVar

import anyio
import anyio.abc

from clusterd import log
from clusterd.control.restart import RestartPacer

logger = log.get("clusterd.control")

KeyT = TypeVar("KeyT", bound=Hashable)  # what names an object (a managed job's id)
IntentT = TypeVar("IntentT")  # its intent: the persisted record
SeenT = TypeVar("SeenT")  # what was observed of it


class Action:
    """One step toward an object's intent, as `Controller.step` decides it and `act` does
    it. Subclasses are frozen dataclasses; `lasting` ones hold while the object is where it
    should be (a watch), and mark a resumed object as brought back."""

    lasting: ClassVar[bool] = False


class Controller(abc.ABC, Generic[KeyT, IntentT, SeenT]):
    @abc.abstractmethod
    def intent(self, key: KeyT) -> IntentT | None:
        """The object's record as persisted now; None once there is nothing left to do (it
        reached a final state). Must not block: read the store's memory."""

    @abc.abstractmethod
    async def observe(self, intent: IntentT) -> SeenT:
        """What exists of the object now (cluster records, node states): read only."""

    @abc.abstractmethod
    def step(self, intent: IntentT, observed: SeenT) -> Action | None:
        """The next action, or None to stop driving. Pure: no I/O, no clock, no store."""

    @abc.abstractmethod
    async def act(self, intent: IntentT, action: Action) -> None:
        """Do `action`. Every change of plan is written to the record before it is acted
        on, so a daemon killed at any instant resumes from the record alone. Returns when
        the action is done (or the object ended); the engine then looks again."""

    @abc.abstractmethod
    async def failed(self, key: KeyT, error: Exception) -> None:
        """A bug in a step: end the object visibly (never the daemon)."""

    def enter(self, key: KeyT) -> None:
        """First thing in the driver's own task: bind the object to its log lines (the task
        was started from whatever call spawned it, and got a copy of that call's context)."""

    async def settle(self, key: KeyT) -> None:
        """After the steps stopped, returned or called off by `Engine.cancel`, still under
        the object's lock: finish what a cancel asked for."""

    def released(self, key: KeyT) -> None:
        """The driver is gone (whatever happened): wake whoever waits on the object. Must
        not block or raise."""


class Engine(Generic[KeyT, IntentT, SeenT]):
    """Runs a driver per object in its own task group: `run` resumes every unfinished
    object (bounded and jittered, see restart.py), `spawn` starts one, `cancel` calls one
    off. At most one driver acts on an object at a time: its lock."""

    def __init__(self, controller: Controller[KeyT, IntentT, SeenT], name: str,
                 pacer: RestartPacer | None = None) -> None:
        self._controller = controller
        self._name = name
        self._pacer = pacer or RestartPacer()
        self._group: anyio.abc.TaskGroup | None = None
        self._drivers: dict[KeyT, anyio.CancelScope] = {}
        self._locks: dict[KeyT, anyio.Lock] = {}
        self._woken: anyio.Event | None = None  # made by the first `pause` (in the loop)

    async def run(self, resume: Iterable[KeyT], *,
                  task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Drive the objects of `resume` (those unfinished when the daemon started), then
        whatever is spawned, until cancelled."""
        try:
            async with anyio.create_task_group() as group:
                self._group = group
                keys = list(resume)
                for key, delay in zip(keys, self._pacer.delays(len(keys)), strict=True):
                    self._start(key, delay)
                task_status.started()
                await anyio.sleep_forever()
        finally:
            self._group = None

    def spawn(self, key: KeyT) -> bool:
        """Start driving `key` now, unless a driver does already. False if the engine is
        not running."""
        if self._group is None:
            return False
        self._start(key, None)
        return True

    def cancel(self, key: KeyT) -> bool:
        """Call off the object's driver (its `settle` still runs); False if it has none."""
        scope = self._drivers.get(key)
        if scope is None:
            return False
        scope.cancel()
        return True

    def driving(self, key: KeyT) -> bool:
        return key in self._drivers

    async def pause(self, seconds: float) -> None:
        """Wait `seconds`, or less if `wake` is called meanwhile: how a driver's lasting
        action (a watch) waits between looks, so that news its controller hears of (the
        config file edited) is looked at now rather than a poll later."""
        if self._woken is None:
            self._woken = anyio.Event()
        with anyio.move_on_after(seconds):
            await self._woken.wait()

    def wake(self) -> None:
        """End every driver's `pause` now: each observes and steps again at once."""
        woken, self._woken = self._woken, None
        if woken is not None:
            woken.set()

    def _start(self, key: KeyT, resume_delay: float | None) -> None:
        if key in self._drivers or self._group is None:
            return
        self._drivers[key] = anyio.CancelScope()
        self._group.start_soon(self._drive, key, resume_delay, name=f"{self._name}-{key}")

    async def _drive(self, key: KeyT, resume_delay: float | None) -> None:
        scope = self._drivers[key]
        lock = self._locks.setdefault(key, anyio.Lock())
        self._controller.enter(key)
        try:
            # The object's lock: a driver spawned while the last one settles waits for it.
            async with lock:
                try:
                    with scope:
                        try:
                            await self._steps(key, resume_delay)
                        except Exception as exc:  # a bug: `failed` says so, and ends it
                            await self._controller.failed(key, exc)
                finally:
                    # From here a cancel or spawn starts a new driver (it waits for the lock).
                    if self._drivers.get(key) is scope:
                        del self._drivers[key]
                await self._controller.settle(key)
        finally:
            if not lock.locked() and lock.statistics().tasks_waiting == 0:
                self._locks.pop(key, None)
            self._controller.released(key)

    async def _steps(self, key: KeyT, resume_delay: float | None) -> None:
        holder = object()
        held = False
        try:
            if resume_delay is not None:
                await self._pacer.admit(resume_delay, holder)
                held = True
            while (intent := self._controller.intent(key)) is not None:
                observed = await self._controller.observe(intent)
                action = self._controller.step(intent, observed)
                if action is None:
                    return
                logger.debug("step", controller=self._name, key=str(key),
                             action=type(action).__name__)
                if held and action.lasting:
                    self._pacer.release(holder)  # back where it should be
                    held = False
                await self._controller.act(intent, action)
        finally:
            if held:
                self._pacer.release(holder)
