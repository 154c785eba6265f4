"""One launch's installs of the runtime: each remote node on its own, so a node that is ready
goes on to start Ray while the others still copy or install (no node waits for the slowest).

The head's runtime is sent first, the workers' once it has arrived. The head's install is on
every launch's path (its Ray, then the agent, start after it), a worker's only until the
head's Ray is up, which takes longer than an install. Sent at once, the installs share what
the nodes share: the daemon's uplink (a laptop's upload sends each node its own 58 MB), and
where nodes share a host (an SSH pool on one machine, pods on one Kubernetes node, the test
beds) its CPU. What a node does on its own after that (pip, on a node whose Python is not
ours) is not held back.

The wheelhouse is checked once for all the nodes, and only if some node needs it: what is
sent is hashed (the archive, or the wheels for a node whose Python is not ours). One round
trip per node finds which need it: a node that has it is linked to it there, another says
what its Python is. Each phase is said once, when the first node reaches it.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable

import anyio

from clusterd import log
from clusterd.concurrency import on_each
from clusterd.faults import fault_point
from clusterd.nodes import NodeInfo
from clusterd.runtime import install, node_install
from clusterd.runtime.install import Wheelhouse, WheelhouseBuilder
from clusterd.runtime.node_install import NodePlan
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.runtime")

Progress = Callable[[str, str], Awaitable[None]]

# How long a worker's install waits for the head's runtime to arrive before it goes anyway
# (the head's own stream gives up at the same time).
HEAD_FIRST_WAIT_S = install.RECEIVE_TIMEOUT_S


class InstallRound:
    def __init__(self, runner_for: Callable[[NodeInfo], CommandRunner], progress: Progress,
                 wheelhouse: Wheelhouse, needing: dict[str, NodePlan], head_id: str,
                 said: set[str]) -> None:
        self._runner_for = runner_for
        self._progress = progress
        self._wheelhouse = wheelhouse
        self._needing = needing  # the plan of each node (by id) that gets an install
        self._head_id = head_id
        self._head_sent = anyio.Event()  # the head has its runtime's bytes (or needs none)
        if head_id not in needing:
            self._head_sent.set()
        self._said = said
        self._lock = anyio.Lock()

    @classmethod
    async def prepare(cls, runner_for: Callable[[NodeInfo], CommandRunner],
                      builder: WheelhouseBuilder, nodes: list[NodeInfo], head: NodeInfo,
                      progress: Progress, force: bool) -> InstallRound:
        """The wheelhouse (built if need be), and which of `nodes` (the remote ones of a
        cluster whose head is `head`) need it, with their Pythons: asked of each at once (a
        test for the ready marker, else a probe), and what they are sent checked once."""
        await progress(f"preparing the runtime for {len(nodes)} node(s)", "install")
        wheelhouse = await builder.ensure()
        needing: dict[str, NodePlan] = {}
        said: set[str] = set()
        saying = anyio.Lock()

        async def say(phase: str, message: str) -> None:
            async with saying:
                if phase in said:
                    return
                said.add(phase)
            await progress(message, "install")

        async def check(node: NodeInfo) -> None:
            # A node that has it is linked to it here and needs nothing more; another says
            # what it is, and what it needs is made ready (a runtime built for its kind, a
            # Python installed there).
            plan = await node_install.plan_node(runner_for(node), builder, wheelhouse, force,
                                                say)
            if plan is not None:
                needing[node.node_id] = plan

        await on_each(nodes, check)
        await fault_point("launch.during_install")
        if needing:
            await anyio.to_thread.run_sync(node_install.verify_plans, wheelhouse,
                                           list(needing.values()))
        return cls(runner_for, progress, wheelhouse, needing, head.node_id, said)

    async def _say_once(self, phase: str, message: str) -> None:
        async with self._lock:
            if phase in self._said:
                return
            self._said.add(phase)
        await self._progress(message, phase)

    async def node(self, node: NodeInfo) -> None:
        """Make `node` run this runtime: sent, installed and linked as the current one if it
        needed it (one that had it was linked when checked). A worker's runtime is sent
        once the head's has arrived, and unpacks behind whatever the head runs
        (install.BEHIND_HEAD_NICENESS)."""
        is_head = node.node_id == self._head_id
        try:
            if node.node_id in self._needing:
                if not is_head:
                    with anyio.move_on_after(HEAD_FIRST_WAIT_S):
                        await self._head_sent.wait()
                await self._install(node, behind_head=not is_head)
        finally:
            if is_head:  # even failed: no worker waits on a head that is gone
                self._head_sent.set()

    async def _install(self, node: NodeInfo, behind_head: bool) -> None:
        runner = self._runner_for(node)
        started = time.monotonic()
        logger.info("runtime install begins", node=node.node_id, head=not behind_head)
        count = len(self._needing)

        plan = self._needing[node.node_id]
        key = plan.foreign.key if plan.foreign is not None else self._wheelhouse.key

        async def announce(phase: str) -> None:
            await self._say_once(phase, f"copying the runtime {key} to "
                                        f"{count} node(s)" if phase == "copy" else
                                        f"installing the runtime on {count} node(s): {key}")

        await node_install.install_planned(runner, self._wheelhouse, plan, announce,
                                           behind_head,
                                           self._head_sent.set if not behind_head else None)
        logger.info("runtime ready on node", node=node.node_id,
                    seconds=round(time.monotonic() - started, 2))
