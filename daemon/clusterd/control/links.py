"""Observed state from the daemon's own side: its SSH connection to each node.

Ray and the agent see a cluster from inside it; a node partitioned from the rest is dropped
from Ray's view only after its health checks give up (about a minute). The daemon holds a
connection to every node it set up, and that connection stops getting answers to its
keepalives as soon as the node is cut off. `NodeLinks` watches the nodes a controller cares
about with a tight keepalive, and says a node is cut off when its connection went silent (or
broke) and a new one cannot be made within a short probe: a connection dropped by a daemon
that was suspended, or by a reset, comes back, and is no loss.

Timing (the budget of a managed job seeing a partitioned worker within 30 s): keepalives every
WATCH_INTERVAL_S, closed after WATCH_COUNT_MAX more unanswered (4 x 4 = 16 s of silence, i.e.
three missed answers: a node loaded enough to miss one is not given up on), then the
controller's next poll (3 s) and a reconnect probe (PROBE_S): at most 27 s.
"""

from __future__ import annotations

from collections.abc import Iterable

import anyio

from clusterctl.protocol import ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import LinkState, SSHConnections

WATCH_INTERVAL_S = 4.0
WATCH_COUNT_MAX = 3
PROBE_S = 8.0


class NodeLinks:
    def __init__(self, ssh: SSHConnections, probe_s: float = PROBE_S) -> None:
        self._ssh = ssh
        self._probe_s = probe_s

    async def cut_off(self, targets: Iterable[SSHTarget]) -> str | None:
        """Why one of these nodes counts as cut off from the daemon, or None. A node this
        daemon has no connection to yet (it just started) is connected to, and watched from
        then on; one it cannot reach that way is no evidence (Ray and the agent decide)."""
        found: list[str] = []

        async def check(target: SSHTarget) -> None:
            self._ssh.watch(target, WATCH_INTERVAL_S, WATCH_COUNT_MAX)
            link = self._ssh.link(target)
            if link.state == LinkState.UP:
                return
            reachable = await self._probe(target)
            if link.state == LinkState.LOST and not reachable:
                what = ("stopped answering the daemon's SSH keepalives" if link.silent
                        else f"dropped the daemon's SSH connection ({link.reason})")
                found.append(f"node {target.host} {what} and cannot be reached again")

        # Probes side by side: a poll takes one probe's time however many nodes need one.
        async with anyio.create_task_group() as group:
            for target in targets:
                group.start_soon(check, target)
        return found[0] if found else None

    async def _probe(self, target: SSHTarget) -> bool:
        with anyio.move_on_after(self._probe_s):
            try:
                # One try, quietly: the node's fate is this probe's to say, not a retry's.
                await self._ssh.get(target, attempts=1)
            except ProtocolError:
                return False
            return True
        return False
