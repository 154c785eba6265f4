"""Autostop on the head node: the setting, how long the cluster has been idle, and the agent's
own enforcement for when no daemon comes by.

Idleness, by the setting's `wait_for`:
  jobs_and_ssh  no job pending, setting up or running, and no user SSH session on any node
                (the daemon's own connections run no terminal, so they never count);
  jobs          no active job;
  none          a hard deadline counted from when autostop was set.
Submitting a job and setting autostop both restart the clock.

The daemon owns the timers. But when no daemon has reached the agent for the idle time plus a
grace period (a laptop asleep, say), the agent stops the cluster's runtime itself and leaves a
marker saying why, which the daemon reconciles when it comes back.
"""

from __future__ import annotations

import json
import time
from collections.abc import Awaitable, Callable

import anyio

from clusterd import log
from clusterd.agent.jobs_db import JobStore
from clusterd.agent.scheduler import Scheduler
from clusterd.agent.v1 import agent_pb2 as pb

logger = log.get("clusterd.agent.autostop")

SETTING_KEY = "autostop"
SSH_SAMPLE_S = 5.0


class ContactClock:
    """When a daemon last reached this agent (any call counts)."""

    def __init__(self) -> None:
        self.last = time.time()

    def touch(self) -> None:
        self.last = time.time()


class AutostopState:
    def __init__(self, store: JobStore, scheduler: Scheduler, contact: ContactClock,
                 count_ssh_sessions: Callable[[], Awaitable[int]]) -> None:
        self._store = store
        self._scheduler = scheduler
        self._contact = contact
        self._count_ssh_sessions = count_ssh_sessions
        self.idle_minutes = -1.0
        self.down = False
        self.wait_for = pb.WAIT_FOR_JOBS_AND_SSH
        self.set_at = 0.0
        self.autostopping = False
        self.ssh_sessions = 0
        self._last_ssh_seen = 0.0

    @property
    def enabled(self) -> bool:
        return self.idle_minutes >= 0

    async def load(self) -> None:
        raw = await self._store.get_setting(SETTING_KEY)
        if raw:
            saved = json.loads(raw)
            self.idle_minutes = float(saved["idle_minutes"])
            self.down = bool(saved["down"])
            self.wait_for = pb.WaitFor.Value(pb.WaitFor.Name(int(saved["wait_for"])))
            self.set_at = float(saved["set_at"])

    async def set(self, idle_minutes: float, down: bool, wait_for: pb.WaitFor) -> None:
        self.idle_minutes = idle_minutes if idle_minutes >= 0 else -1.0
        self.down = down
        self.wait_for = wait_for or pb.WAIT_FOR_JOBS_AND_SSH
        self.set_at = time.time()
        # Setting autostop restarts the idle clock, as submitting a job does.
        self._scheduler.last_activity = self.set_at
        await self._store.set_setting(
            SETTING_KEY,
            json.dumps({"idle_minutes": self.idle_minutes, "down": self.down,
                        "wait_for": self.wait_for, "set_at": self.set_at}),
        )

    def idle_since(self) -> float:
        """Since when the cluster counts as idle; 0 while it is busy."""
        if self.wait_for == pb.WAIT_FOR_NONE:
            return self.set_at
        if self._scheduler.active_jobs():
            return 0.0
        since = max(self._scheduler.last_activity, self.set_at)
        if self.wait_for == pb.WAIT_FOR_JOBS_AND_SSH:
            if self.ssh_sessions:
                return 0.0
            since = max(since, self._last_ssh_seen)
        return since

    def idle_info(self) -> pb.GetIdleInfoResponse:
        return pb.GetIdleInfoResponse(
            idle_since=self.idle_since(),
            active_jobs=self._scheduler.active_jobs(),
            ssh_sessions=self.ssh_sessions,
            autostop_idle_minutes=self.idle_minutes,
            autostop_down=self.down,
            autostop_wait_for=self.wait_for,
            autostop_set_at=self.set_at,
        )

    async def count_ssh_sessions(self) -> None:
        """Count user SSH sessions on every node now."""
        try:
            with anyio.fail_after(30):
                self.ssh_sessions = await self._count_ssh_sessions()
        except Exception as exc:  # a node being down must not stop the counting
            logger.warning("counting ssh sessions failed", error=str(exc)[:200])
        if self.ssh_sessions:
            self._last_ssh_seen = time.time()

    async def current_idle_info(self) -> pb.GetIdleInfoResponse:
        """Idleness as of now (sessions counted afresh when they matter)."""
        if self.wait_for == pb.WAIT_FOR_JOBS_AND_SSH:
            await self.count_ssh_sessions()
        return self.idle_info()

    async def sample_ssh_sessions(self) -> None:
        """Keep `ssh_sessions` current between the daemon's questions (the agent's own
        enforcement relies on it when no daemon comes by)."""
        while True:
            await self.count_ssh_sessions()
            await anyio.sleep(SSH_SAMPLE_S)

    async def enforce(self, grace_s: float, check_s: float,
                      stop_runtime: Callable[[str, bool], Awaitable[None]]) -> None:
        """Stop the cluster when it is past due and no daemon has come by to do it."""
        while True:
            await anyio.sleep(check_s)
            if not self.enabled or self.autostopping:
                continue
            since = self.idle_since()
            if not since:
                continue
            window = self.idle_minutes * 60 + grace_s
            now = time.time()
            if now - since >= window and now - self._contact.last >= window:
                self.autostopping = True
                reason = (f"idle for {(now - since) / 60:.1f} min and no daemon for "
                          f"{(now - self._contact.last) / 60:.1f} min: the agent "
                          f"{'tore down' if self.down else 'stopped'} the cluster itself")
                logger.warning("autostopping on our own", reason=reason)
                await stop_runtime(reason, self.down)
