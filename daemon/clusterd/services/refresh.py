"""Keeping cluster status true: a periodic refresh (and `status --refresh` on demand).

Each cycle asks every provider once for all its clusters (per provider and region), checks
the agent of each cluster whose nodes run, and reconciles: every node up and the agent
healthy is UP; every node stopped is STOPPED; some missing, or the agent or Ray dead, is INIT
with the reason; none left is terminated (the record goes, its events stay). A cluster whose
lock is held exclusively (a launch, stop or down in flight) is left alone: that request will
record the outcome, and a refresh must never remove a record whose launch is still running.
A cluster whose checks fail is retried with backoff, not every cycle.
"""

from __future__ import annotations

import random
import time
from typing import Any

import anyio
import anyio.abc
import anyio.lowlevel

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import first_error, survive
from clusterd.locks import ClusterLocks, LockMode
from clusterd.nodes import NodeInfo, NodeStatus
from clusterd.providers.base import ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.requests import RequestManager, RunningRequest
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.manager import RuntimeManager
from clusterd.services.clusters import ClusterService
from clusterd.services.common import provider_handle
from clusterd.services.orphans import OrphanWatch
from clusterd.state.clusters import ClusterRecord, ClusterStore

logger = log.get("clusterd.refresh")

CONCURRENCY = 16
JITTER = 0.1  # each cycle waits interval * (1 ± JITTER), so refreshes do not beat in step
MAX_BACKOFF_S = 600.0
# Orphans are looked for on the first cycle and every this many after (a few API calls per
# region of every provider: not for every refresh).
ORPHAN_SCAN_EVERY = 10
CLEANUP_TIMEOUT_S = 300.0


class RefreshService:
    def __init__(
        self,
        store: ClusterStore,
        locks: ClusterLocks,
        providers: ProviderRegistry,
        runtime: RuntimeManager,
        access: AgentAccess,
        clusters: ClusterService,
        requests: RequestManager,
        interval_s: float,
        orphans: OrphanWatch | None = None,
    ) -> None:
        self.orphans = orphans
        self._store = store
        self._locks = locks
        self._providers = providers
        self._runtime = runtime
        self._access = access
        self._clusters = clusters
        self._requests = requests
        self.interval_s = interval_s
        # name -> (consecutive failures, not before): clusters whose checks keep failing.
        self._backoff: dict[str, tuple[int, float]] = {}
        self.cycles = 0
        self.last_cycle_s = 0.0
        self._cycling = anyio.Lock()
        # Forced refreshes (`status --refresh`) asked for while one runs share the next one.
        self._forced = anyio.Lock()
        self._forced_started = 0
        self._forced_done = 0
        self._forced_names: set[str] | None = set()  # None: every cluster

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """The refresh loop: at once (INIT clusters left by a crash are settled first), then
        every interval, with jitter."""
        task_status.started()
        while True:
            await survive("refresh", self.cycle)
            if self.orphans is not None and (self.cycles - 1) % ORPHAN_SCAN_EVERY == 0:
                await survive("orphan scan", self.orphans.scan)
            await anyio.sleep(self.interval_s * random.uniform(1 - JITTER, 1 + JITTER))

    async def refresh_now(self, names: list[str] | None = None) -> None:
        """A forced refresh of `names` (None: all), merged with others asked for at the same
        time: all callers waiting while one cycle runs are served by the one cycle after it
        (it starts after they asked, and covers all their clusters), not one cycle each."""
        asked_after = self._forced_started
        if names is None or self._forced_names is None:
            self._forced_names = None
        else:
            self._forced_names |= set(names)
        async with self._forced:
            if self._forced_done > asked_after:
                return  # a cycle that started after we asked has finished
            self._forced_started += 1
            number = self._forced_started
            wanted, self._forced_names = self._forced_names, set()
            try:
                await self.cycle(None if wanted is None else sorted(wanted), force=True)
            except BaseException:
                # Abandoned (its client left): the callers it served take their turn again.
                if wanted is None or self._forced_names is None:
                    self._forced_names = None
                else:
                    self._forced_names |= wanted
                raise
            self._forced_done = number

    async def cycle(self, names: list[str] | None = None, *, force: bool = False) -> None:
        # One cycle at a time: two settling the same cluster at once would both record its
        # change (a forced refresh waits for the periodic one, then looks again).
        async with self._cycling:
            await self._cycle(names, force)

    async def _cycle(self, names: list[str] | None, force: bool) -> None:
        started = time.monotonic()
        now = time.time()
        for gone in self._backoff.keys() - set(self._store.names()):
            del self._backoff[gone]
        chosen = [r for r in self._store.all()
                  if (names is None or r.name in names)
                  and (force or self._backoff.get(r.name, (0, 0.0))[1] <= now)]
        # INIT first: those are the ones a crash or a failure may have left unsettled.
        chosen.sort(key=lambda r: (r.status != ClusterStatus.INIT, r.refreshed_at or 0))
        # One group per provider: each provider makes as few calls as it can for all of its
        # clusters (AWS: one DescribeInstances per region).
        by_provider: dict[str, list[ClusterRecord]] = {}
        for record in chosen:
            if self._busy(record):
                continue
            if record.handle.provider is None:
                await self._note_unstarted(record)
                continue
            by_provider.setdefault(record.provider, []).append(record)
        unchanged: list[str] = []  # stamped together at the end of the cycle
        with first_error():
            async with anyio.create_task_group() as group:
                for provider_name, records in by_provider.items():
                    group.start_soon(self._refresh_group, provider_name, records, unchanged)
        await self._store.mark_refreshed(unchanged, time.time())
        self.cycles += 1
        self.last_cycle_s = time.monotonic() - started

    async def _note_unstarted(self, record: ClusterRecord) -> None:
        """A launch that died before the provider answered its create call: say what it
        left (nodes found where it was creating them, or none) and what to do."""
        intent = record.handle.intent
        found = 0
        if intent is not None:
            try:
                provider = self._providers.get(record.provider)
                nodes = await provider.query(
                    record.cloud_name, provider.handle_for_intent(record.cloud_name, intent))
                found = sum(1 for n in nodes if n.status != NodeStatus.TERMINATED)
            except ProtocolError as exc:
                logger.info("cannot look for an interrupted launch's nodes",
                            cluster=record.name, error=exc.message)
        what = (f"launch interrupted after creating {found} node(s) in {intent.provider}"
                f"/{intent.region}/{intent.zone}" if found and intent else
                "launch interrupted before any node was created")
        reason = (f"{what}: `clusterctl launch -c {record.name}` finishes it, "
                  f"`clusterctl down {record.name}` drops it")
        if record.status_reason != reason:
            await self._store.set_status(record.name, ClusterStatus.INIT, reason,
                                         refreshed_at=time.time())

    def _busy(self, record: ClusterRecord) -> bool:
        return any(h.mode == LockMode.EXCLUSIVE for h in self._locks.holders(record.name))

    def _still_ours(self, record: ClusterRecord) -> bool:
        """Whether what a check found about `record` may still be written: its record is
        still the cluster's (a launch since makes a new one, with a cloud name of its own;
        a down removes it) and no request holds the cluster. Asked again after every wait:
        the check awaits the provider and the agent for seconds, and a managed job's
        controller tears down and relaunches a lost cluster in that time."""
        current = self._store.get(record.name)
        return (current is not None and current.cloud_name == record.cloud_name
                and not self._busy(current))

    async def _refresh_group(self, provider_name: str, records: list[ClusterRecord],
                             unchanged: list[str]) -> None:
        provider = self._providers.get(provider_name)
        try:
            found = await provider.query_many(
                [(r.cloud_name, handle) for r in records
                 if (handle := r.handle.provider) is not None]  # all (see _cycle)
            )
        except ProvisionError as exc:
            found = {r.cloud_name: exc for r in records}

        # A few workers, not a task per cluster: a thousand tasks made ready at once would
        # hold every status request behind them for tens of milliseconds.
        pending = iter(records)

        async def worker() -> None:
            for record in pending:
                await self._settle(record, found.get(record.cloud_name, []), unchanged)
                await anyio.lowlevel.checkpoint()

        async with anyio.create_task_group() as group:
            for _ in range(min(CONCURRENCY, len(records))):
                group.start_soon(worker)

    async def _settle(self, record: ClusterRecord, nodes: list[NodeInfo] | ProvisionError,
                      unchanged: list[str]) -> None:
        name = record.name
        if not self._still_ours(record):
            return
        try:
            if isinstance(nodes, ProvisionError):
                raise nodes
            status, reason = await self._reconcile(record, nodes)
            await self._clusters.ledger.observed(record, nodes)
            if status is None and self._still_ours(record):
                await self._access.close(name)
                await self._clean_up_gone(record)
        except TimeoutError:
            exc = ProtocolError(ErrorCode.PROVIDER_ERROR, "cleaning up timed out")
            await self._back_off(name, exc)
            return
        except ProtocolError as exc:
            await self._back_off(name, exc)
            return
        self._backoff.pop(name, None)
        if status is None:
            await self._clusters.forget_nodes(record)
            if self._still_ours(record):
                await self._store.remove(name, reason)
            return
        if not self._still_ours(record):
            return
        if status != record.status or (status == ClusterStatus.INIT
                                       and reason != record.status_reason):
            # An INIT cluster's reason is what tells the user what is wrong: keep it current.
            await self._store.set_status(name, status, reason, refreshed_at=time.time())
        else:
            unchanged.append(name)

    async def _back_off(self, name: str, exc: ProtocolError) -> None:
        """A cluster whose checks failed is tried again later, each time later."""
        failures = self._backoff.get(name, (0, 0.0))[0] + 1
        delay = min(MAX_BACKOFF_S, self.interval_s * 2 ** (failures - 1))
        self._backoff[name] = (failures, time.time() + delay)
        await self._store.add_event(name, "refresh", f"refresh failed ({exc.message}); "
                                    f"next try in {delay:.0f} s")

    async def _clean_up_gone(self, record: ClusterRecord) -> None:
        """Every node went away behind our back (preempted, terminated by hand): what the
        cluster had around its nodes (a security group) goes too. Failing that, the record
        stays, and the next refresh tries again."""
        provider = self._providers.get(record.provider)
        with anyio.fail_after(CLEANUP_TIMEOUT_S):
            await provider.cleanup_ports(record.cloud_name, provider_handle(record, provider))
        self._clusters.forget_config(record.name)

    async def _reconcile(
        self, record: ClusterRecord, nodes: list[NodeInfo]
    ) -> tuple[ClusterStatus | None, str]:
        gone = [n for n in nodes if n.status == NodeStatus.TERMINATED]
        nodes = [n for n in nodes if n.status != NodeStatus.TERMINATED]
        why = _reasons(gone)
        if not nodes:
            return None, "refresh found no nodes left" + (f": {why}" if why else "")
        states = {n.status for n in nodes}
        if states == {NodeStatus.STOPPED} and not gone:
            stopped_why = _reasons(nodes)
            return ClusterStatus.STOPPED, "refresh found every node stopped" + (
                f" ({stopped_why})" if stopped_why else "")
        if self._providers.get(record.provider).agentless and states == {NodeStatus.RUNNING}:
            return ClusterStatus.UP, "refresh found every node running"
        if len(nodes) < record.num_nodes or states != {NodeStatus.RUNNING}:
            running = sum(1 for n in nodes if n.status == NodeStatus.RUNNING)
            unreachable = sum(1 for n in nodes if n.status == NodeStatus.UNREACHABLE)
            detail = f", {unreachable} unreachable" if unreachable else ""
            if gone:
                detail += f", {len(gone)} gone ({why})"
            elif other := _reasons([n for n in nodes if n.status != NodeStatus.RUNNING]):
                detail += f" ({other})"
            return ClusterStatus.INIT, (f"refresh found {running} of {record.num_nodes} "
                                        f"nodes running{detail}")
        try:
            health = await self._agent_health(record)
        except ProtocolError as exc:
            await self._access.reset(record.name)
            if exc.code == ErrorCode.AGENT_VERSION_MISMATCH:
                return ClusterStatus.INIT, exc.message
            return await self._agent_gone(record, exc)
        if not health.ray_connected or health.ray_nodes_alive < record.num_nodes:
            return ClusterStatus.INIT, (f"Ray has {health.ray_nodes_alive} of "
                                        f"{record.num_nodes} nodes"
                                        + _missing_from_ray(nodes, health.ray_node_ips))
        return ClusterStatus.UP, "refresh found every node and the agent healthy"

    async def _agent_health(self, record: ClusterRecord) -> Any:
        """The agent's health; an agent that does not answer is asked once more on a fresh
        connection (the old one may have broken when the agent restarted) before it counts
        as gone."""
        try:
            return await (await self._access.client(record)).check_version()
        except ProtocolError as exc:
            if exc.code != ErrorCode.AGENT_UNREACHABLE:
                raise
        await self._access.reset(record.name)
        return await (await self._access.client(record)).check_version()

    async def _agent_gone(self, record: ClusterRecord, error: ProtocolError
                          ) -> tuple[ClusterStatus | None, str]:
        """The agent does not answer: did it stop the cluster itself (autostop with no daemon
        around), or did it die?"""
        info = await self._clusters.cluster_info(record)
        head = await self._runtime.head_status(info)
        marker: dict[str, Any] | None = head.autostopped
        if marker and record.status != ClusterStatus.STOPPED:
            await self._requests.start(
                "autostop", record.name, {"cluster": record.name, "by": "agent"},
                lambda r: self._settle_self_stop(r, record.name, marker),
            )
            return record.status, record.status_reason
        if not head.ray.alive:
            return ClusterStatus.INIT, "the Ray head is not running"
        return ClusterStatus.INIT, f"agent not healthy: {error.message}"

    async def _settle_self_stop(self, request: RunningRequest, name: str,
                                marker: dict[str, Any]) -> dict[str, Any]:
        """Record what the agent did on its own, and finish it (hand the nodes back)."""
        reason = f"autostop by the agent: {marker.get('reason', 'idle')}"
        record = self._store.get(name)
        if record is None:
            return {"cluster": name}
        provider = self._providers.get(record.provider)
        if marker.get("down") or not provider.can_stop:
            return await self._clusters.down(request, name, purge=True, reason=reason)
        return await self._clusters.stop(request, name, reason=reason)



def _missing_from_ray(nodes: list[NodeInfo], ray_ips: Any) -> str:
    """Which running nodes Ray does not count (running, so cut off or their Ray is dead)."""
    alive = set(ray_ips)
    if not alive:
        return ""
    missing = [n for n in nodes if n.internal_ip and n.internal_ip not in alive]
    if not missing:
        return ""
    named = ", ".join(f"{n.internal_ip} ({n.node_id})" for n in missing)
    return (f": {named} {'is' if len(missing) == 1 else 'are'} not in it (unreachable from "
            f"the head, or its Ray died)")


def _reasons(nodes: list[NodeInfo]) -> str:
    """The providers' words on why nodes are as they are (one per distinct reason)."""
    seen = dict.fromkeys(f"{n.node_id}: {n.reason}" if len(nodes) > 1 else n.reason
                         for n in nodes if n.reason)
    return "; ".join(seen)
