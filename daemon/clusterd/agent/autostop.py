"""Autostop settings and idleness, as the agent sees them on the head node.

The daemon owns the timers; the agent answers how long the cluster has been idle and keeps
the setting so it survives restarts.
"""

from __future__ import annotations

import json
import time

import psutil

from clusterd.agent.jobs_db import JobStore
from clusterd.agent.scheduler import Scheduler
from clusterd.agent.v1 import agent_pb2 as pb

SETTING_KEY = "autostop"


def user_ssh_sessions() -> int:
    """Interactive logins from another host (utmp). The daemon runs commands without a
    terminal, so its own connections never appear here."""
    return sum(1 for user in psutil.users() if user.host)


class AutostopState:
    def __init__(self, store: JobStore, scheduler: Scheduler) -> None:
        self._store = store
        self._scheduler = scheduler
        self.idle_minutes = -1.0
        self.down = False
        self.wait_for = pb.WAIT_FOR_JOBS_AND_SSH
        self.set_at = 0.0
        self.autostopping = False

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

    def idle_info(self) -> pb.GetIdleInfoResponse:
        active = self._scheduler.active_jobs()
        return pb.GetIdleInfoResponse(
            idle_since=0 if active else self._scheduler.last_activity,
            active_jobs=active,
            ssh_sessions=user_ssh_sessions(),
            autostop_idle_minutes=self.idle_minutes,
            autostop_down=self.down,
            autostop_wait_for=self.wait_for,
            autostop_set_at=self.set_at,
        )
