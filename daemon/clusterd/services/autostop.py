"""Autostop timers, owned by the daemon.

A cluster's deadline is when its agent says it became idle (see agent/autostop.py for what
idle means under each `wait_for`) plus its idle minutes. The loop checks every few seconds, so
a timer fires within that of its deadline; deadlines are written to the database, and after a
restart the first check fires any that fell due meanwhile. When one fires, a request named
`autostop` takes the cluster's lock, checks once more that the cluster is still idle, and
stops it, or tears it down. Every decision is an event.
"""

from __future__ import annotations

import time
from typing import Any

import anyio
import anyio.abc

from clusterctl.protocol import ClusterStatus, ProtocolError
from clusterd import log
from clusterd.concurrency import survive
from clusterd.locks import ClusterLocks, LockMode
from clusterd.providers.registry import ProviderRegistry
from clusterd.requests import RequestManager, RunningRequest
from clusterd.runtime.agent_access import AgentAccess
from clusterd.services.clusters import ClusterService
from clusterd.services.common import require_cluster, require_up
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.tasks.spec import Autostop

logger = log.get("clusterd.autostop")


CONCURRENCY = 16


def span(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.1f} min"


class AutostopService:
    def __init__(
        self,
        store: ClusterStore,
        locks: ClusterLocks,
        providers: ProviderRegistry,
        access: AgentAccess,
        clusters: ClusterService,
        requests: RequestManager,
        check_s: float,
    ) -> None:
        self._store = store
        self._locks = locks
        self._providers = providers
        self._access = access
        self._clusters = clusters
        self._requests = requests
        self.check_s = check_s

    # -- the setting ------------------------------------------------------------------------

    async def configure(self, request: RunningRequest, name: str,
                        setting: Autostop | None) -> dict[str, Any]:
        """Set (or with None, cancel) a cluster's autostop."""
        require_up(require_cluster(self._store, name))
        async with self._locks.hold(name, LockMode.SHARED, request.id, "autostop",
                                    on_blocked=request.blocked):
            record = require_up(require_cluster(self._store, name))
            await self._clusters.apply_autostop(record, setting, request.id)
        if setting is None:
            return {"cluster": name, "autostop": None}
        return {"cluster": name, "autostop": {"idle_minutes": setting.idle_minutes,
                                              "down": setting.down,
                                              "wait_for": setting.wait_for}}

    # -- the timers -------------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        task_status.started()
        while True:
            await survive("autostop", self.check)
            await anyio.sleep(self.check_s)

    async def check(self) -> None:
        """One pass over every cluster with autostop: update deadlines, fire the due."""
        began = time.time()
        limiter = anyio.CapacityLimiter(CONCURRENCY)
        records = [r for r in self._store.all()
                   if r.status == ClusterStatus.UP and r.autostop_minutes is not None
                   and r.name not in self._clusters.autostopping]

        async def one(record: ClusterRecord) -> None:
            async with limiter:
                await self._check_one(record)

        async with anyio.create_task_group() as group:
            for record in records:
                group.start_soon(one, record)
        # What a test waits on to know a moment has passed with no autostop (a pass that
        # began after it, whose decisions are all events by now), instead of sleeping.
        logger.debug("autostop pass", began=round(began, 3), checked=[r.name for r in records])

    async def idle_for(self, record: ClusterRecord) -> float | None:
        """Seconds the cluster has been idle, per its agent; None while busy or unknown."""
        try:
            agent = await self._access.client(record)
            with anyio.fail_after(15):
                info = await agent.idle_info()
        except (ProtocolError, TimeoutError):
            return None  # the refresh loop finds out what is wrong
        return None if info.idle_since is None else time.time() - info.idle_since

    async def _check_one(self, record: ClusterRecord) -> None:
        assert record.autostop_minutes is not None
        idle = await self.idle_for(record)
        now = time.time()
        if idle is None:
            if record.autostop_deadline is not None:
                await self._store.update(record.name, autostop_deadline=None)
            return
        deadline = now - idle + record.autostop_minutes * 60
        if record.autostop_deadline is None or abs(deadline - record.autostop_deadline) > 1:
            await self._store.update(record.name, autostop_deadline=deadline)
        if now < deadline:
            return
        late = now - deadline
        reason = (f"idle for {span(idle)} (autostop after {record.autostop_minutes:g} min, "
                  f"waiting for {record.autostop_wait_for})")
        await self._store.add_event(record.name, "autostop",
                                    f"autostop due {late:.1f} s ago: {reason}")
        request = await self._requests.start(
            "autostop", record.name, {"cluster": record.name, "by": "daemon"},
            lambda r: self._fire(r, record.name, reason),
        )
        self._clusters.autostopping[record.name] = request.id

    async def _fire(self, request: RunningRequest, name: str, reason: str) -> dict[str, Any]:
        try:
            record = require_cluster(self._store, name)

            async def still_idle() -> str | None:
                current = self._store.get(name)
                if current is None or current.autostop_minutes is None:
                    return "autostop was cancelled"
                idle = await self.idle_for(current)
                if idle is None or idle < current.autostop_minutes * 60:
                    return "the cluster is no longer idle"
                return None

            provider = self._providers.get(record.provider)
            label = f"autostopped: {reason}"
            if record.autostop_down or not provider.can_stop:
                result = await self._clusters.down(request, name, purge=False, reason=label,
                                                   precheck=still_idle)
            else:
                result = await self._clusters.stop(request, name, reason=label,
                                                   precheck=still_idle)
            if result.get("skipped"):
                await self._store.add_event(name, "autostop",
                                            f"autostop called off: {result['skipped']}",
                                            request.id)
            return result
        finally:
            self._clusters.autostopping.pop(name, None)
