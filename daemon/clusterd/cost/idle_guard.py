"""The idle-cost guard (issue 39 §3): a cluster UP and idle with no autostop set, past
`cost.idle_warning_after` (2 h by default), is warned of: a cluster event naming its cost so
far and its burn rate and how to set an autostop, and a notice on every `clusterctl`
command (the hello's `notices`) until the cluster is busy again, stopped, down, or given an
autostop.

A controller on the engine (clusterd.control), one object per such cluster, keyed by its
name. Intent: the cluster's record (UP, no autostop, not a managed job's: the job ends its
own cluster) and the configured time; none otherwise, and the driver stops (its notice
goes). Observe: how long the agent says the cluster has been idle (None while busy: a job
pending or running, a user's SSH session, as autostop counts it), what it costs now and so
far (the ledger), and whether its warning for this idle stretch is already an event. Step:
`decide`, pure. Act: the warning's event is written, then its notice set; a watch waits
until the warning is due (or a poll, `check_s`).

Crash safety: the event is the record. A daemon restarted finds the warning of this idle
stretch among the cluster's events and gives the notice again without a second event.
Only clusters that cost something are warned of (a `local` cluster, or an ssh pool with no
price, costs nothing idle).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Protocol

import anyio
import anyio.abc

from clusterctl.protocol import NOTICE_IDLE, ClusterStatus, Notice
from clusterd import log
from clusterd.control import Action, Controller, Engine
from clusterd.cost.ledger import Ledger
from clusterd.state.clusters import ClusterRecord, ClusterStore

logger = log.get("clusterd.idle_guard")

EVENT_KIND = "idle-cost"


class IdleProbe(Protocol):
    async def __call__(self, record: ClusterRecord) -> float | None:
        """Seconds the cluster has been idle, as its agent says; None while busy or when
        the agent cannot be asked (the refresh loop finds out what is wrong)."""
        ...


@dataclasses.dataclass(frozen=True)
class IdleIntent:
    record: ClusterRecord
    after_s: float


@dataclasses.dataclass(frozen=True)
class IdleSeen:
    idle_s: float | None  # None: busy, or not known
    per_hour: float  # dollars per hour it costs now
    cost: float  # dollars this cluster has cost so far
    warned: bool  # this idle stretch's warning is an event already
    noticed: bool  # its notice is up


@dataclasses.dataclass(frozen=True)
class Warn(Action):
    text: str
    event: bool  # write the event (False: after a restart, only the notice again)


@dataclasses.dataclass(frozen=True)
class Busy(Action):
    """Busy again (or free now): the notice goes."""


@dataclasses.dataclass(frozen=True)
class Watch(Action):
    seconds: float
    lasting = True


def span(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 7200 else f"{seconds / 3600:.1f} h"


def warning(name: str, seen: IdleSeen) -> str:
    assert seen.idle_s is not None
    return (f"cluster {name} has been idle for {span(seen.idle_s)} with no autostop, at "
            f"${seen.per_hour:.4g}/h: ${seen.cost:.2f} so far; set one: clusterctl autostop "
            f"{name} -i 30 (or clusterctl down {name})")


def decide(intent: IdleIntent, seen: IdleSeen, check_s: float) -> Action:
    """The next thing to do for an idle-guarded cluster. Pure."""
    name = intent.record.name
    if seen.idle_s is None or seen.per_hour <= 0:
        return Busy() if seen.noticed else Watch(check_s)
    if seen.idle_s >= intent.after_s:
        if not (seen.warned and seen.noticed):
            return Warn(warning(name, seen), event=not seen.warned)
        return Watch(check_s)
    if seen.noticed:
        return Busy()  # idle again since a while ago, but not for long enough yet
    return Watch(min(check_s, intent.after_s - seen.idle_s))


class IdleGuard(Controller[str, IdleIntent, IdleSeen]):
    def __init__(self, after_s: Callable[[], float | None], store: ClusterStore,
                 ledger: Ledger, idle_for: IdleProbe, *, check_s: float = 30.0,
                 clock: Callable[[], float] = time.time) -> None:
        self._after_s = after_s
        self._store = store
        self._ledger = ledger
        self._idle_for = idle_for
        self._check_s = check_s
        self._clock = clock
        self._notices: dict[str, str] = {}
        self._engine: Engine[str, IdleIntent, IdleSeen] = Engine(self, "idle-guard")

    def guarded(self) -> list[str]:
        """The clusters to watch now."""
        if self._after_s() is None:
            return []
        return [r.name for r in self._store.all() if _eligible(r)]

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        async with anyio.create_task_group() as group:
            await group.start(self._engine.run, self.guarded())
            task_status.started()
            while True:  # clusters that came UP (or lost their autostop) get a driver
                await anyio.sleep(self._check_s)
                for name in self.guarded():
                    self._engine.spawn(name)

    def notices(self) -> list[Notice]:
        """A line per cluster warned of that is still UP, idle and without autostop."""
        return [Notice(text, kind=NOTICE_IDLE) for name, text in sorted(self._notices.items())
                if self.intent(name) is not None]

    # -- the engine's Controller ----------------------------------------------------------

    def intent(self, key: str) -> IdleIntent | None:
        record = self._store.get(key)
        after = self._after_s()
        if record is None or after is None or not _eligible(record):
            return None
        return IdleIntent(record, after)

    async def observe(self, intent: IdleIntent) -> IdleSeen:
        record = intent.record
        per_hour = self._ledger.rate(record.name)
        # A free cluster is never warned of: its agent need not be asked.
        idle = await self._idle_for(record) if per_hour > 0 else None
        now = self._clock()
        warned = False
        if idle is not None and idle >= intent.after_s:
            warned = await self._store.has_event(record.name, EVENT_KIND, now - idle)
        return IdleSeen(idle, per_hour, self._ledger.cost_so_far(record, now), warned,
                        record.name in self._notices)

    def step(self, intent: IdleIntent, observed: IdleSeen) -> Action | None:
        return decide(intent, observed, self._check_s)

    async def act(self, intent: IdleIntent, action: Action) -> None:
        name = intent.record.name
        match action:
            case Watch(seconds):
                await self._engine.pause(seconds)
            case Warn(text, event):
                if event:  # the record first: a restart finds it and warns no second time
                    logger.warning("idle cluster with no autostop", cluster=name, text=text)
                    await self._store.add_event(name, EVENT_KIND, text)
                self._notices[name] = text
            case Busy():
                self._notices.pop(name, None)
            case _:
                raise TypeError(f"not an idle guard's action: {action!r}")

    async def failed(self, key: str, error: Exception) -> None:
        logger.error("idle guard failed", cluster=key, exc_info=error)

    async def settle(self, key: str) -> None:
        self._notices.pop(key, None)  # stopped, down, given an autostop, or guard off


def _eligible(record: ClusterRecord) -> bool:
    return (record.status == ClusterStatus.UP and record.autostop_minutes is None
            and record.owner is None)
