"""Named fault points, for crash-recovery tests only.

`await fault_point("launch.before_create")` does nothing, unless the daemon was started with
CLUSTERD_TEST_FAULTS naming that point (comma-separated): then the daemon kills itself on the
spot with SIGKILL, exactly as `kill -9` at that instant would. Never set it outside tests.

Points: launch.before_create (the intent is on disk), launch.after_create (the provider made
the nodes; the handle is not recorded yet), launch.waiting (recorded; waiting for the nodes),
launch.during_install, launch.after_agent, exec.during_submit, exec.streaming,
down.mid_teardown, down.mid_terminate (instances terminated, per-cluster resources not yet).
"""

from __future__ import annotations

import os
import signal

from clusterd import log

logger = log.get("clusterd.faults")
ENV = "CLUSTERD_TEST_FAULTS"
ARMED = frozenset(p.strip() for p in os.environ.get(ENV, "").split(",") if p.strip())


async def fault_point(name: str) -> None:
    if name in ARMED:
        logger.warning("fault point reached: killing the daemon", point=name)
        os.kill(os.getpid(), signal.SIGKILL)
