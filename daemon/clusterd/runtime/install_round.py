"""One launch's installs of the runtime: each remote node on its own, so a node that is ready
goes on to start Ray while the others still copy or install (no node waits for the slowest).

The wheelhouse is checked once for all the copies (it hashes every wheel), and only if some
node needs it; each phase is said once, when the first node reaches it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from clusterd import log
from clusterd.concurrency import on_each
from clusterd.faults import fault_point
from clusterd.nodes import NodeInfo
from clusterd.runtime import install
from clusterd.runtime.install import Wheelhouse, WheelhouseBuilder
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.runtime")

Progress = Callable[[str, str], Awaitable[None]]


class InstallRound:
    def __init__(self, runner_for: Callable[[NodeInfo], CommandRunner], progress: Progress,
                 wheelhouse: Wheelhouse, needing: set[str]) -> None:
        self._runner_for = runner_for
        self._progress = progress
        self._wheelhouse = wheelhouse
        self._needing = needing  # node ids that get a copy and an install
        self._said: set[str] = set()
        self._lock = anyio.Lock()

    @classmethod
    async def prepare(cls, runner_for: Callable[[NodeInfo], CommandRunner],
                      builder: WheelhouseBuilder, nodes: list[NodeInfo], progress: Progress,
                      force: bool) -> InstallRound:
        """The wheelhouse (built if need be), and which of `nodes` need it: asked of each
        at once (a cheap test for the ready marker), and checked once if any does."""
        await progress(f"preparing the runtime for {len(nodes)} node(s)", "install")
        wheelhouse = await builder.ensure()
        needing: set[str] = set()

        async def check(node: NodeInfo) -> None:
            # A node that has it is linked to it here and needs nothing more.
            if force or not await install.linked_if_installed(runner_for(node), wheelhouse):
                needing.add(node.node_id)

        await on_each(nodes, check)
        await fault_point("launch.during_install")
        if needing:
            await anyio.to_thread.run_sync(wheelhouse.verify)
        return cls(runner_for, progress, wheelhouse, needing)

    async def _say_once(self, phase: str, message: str) -> None:
        async with self._lock:
            if phase in self._said:
                return
            self._said.add(phase)
        await self._progress(message, phase)

    async def node(self, node: NodeInfo, behind_head: bool = False) -> None:
        """Make `node` run this runtime: copied, installed and linked as the current one if
        it needed it (one that had it was linked when checked). A worker's install goes
        `behind_head` (install.BEHIND_HEAD_NICENESS)."""
        runner = self._runner_for(node)
        if node.node_id not in self._needing:
            return  # linked when checked
        started = time.monotonic()
        count = len(self._needing)

        async def announce(phase: str) -> None:
            await self._say_once(phase, f"copying the runtime {self._wheelhouse.key} to "
                                        f"{count} node(s)" if phase == "copy" else
                                        f"installing the runtime on {count} node(s): "
                                        f"{self._wheelhouse.key}")

        await install.install_checked(runner, self._wheelhouse, announce, behind_head)
        await install.link_current(runner, self._wheelhouse)
        logger.info("runtime ready on node", node=node.node_id,
                    seconds=round(time.monotonic() - started, 2))
