"""Stop and down, and what a failed launch leaves behind.

Teardown stops the runtime first (the agent cancels its jobs, so clients following their logs
learn how they ended), then closes the agent connection (and its tunnel), then terminates and
cleans up, and only then forgets the record. `down` and `stop` pre-empt a queued launch or
start of the same cluster; `down` with `call_off` also calls off one in progress.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd import log
from clusterd.cost.ledger import Ledger, node_times
from clusterd.faults import fault_point
from clusterd.locks import ClusterLocks, Holder, LockMode
from clusterd.nodes import ClusterInfo, NodeStatus, SSHTarget
from clusterd.providers.base import Provider, ProviderHandle, ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.requests import RunningRequest
from clusterd.services.common import brief, provider_handle, require_cluster
from clusterd.services.node_runtime import Runtime
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.storage.service import StorageService

logger = log.get("clusterd.clusters")

# Run under a cluster's lock just before a stop or down; returns why to call it off, or None.
Precheck = Callable[[], Awaitable[str | None]]
ForgetNodes = Callable[[list[SSHTarget]], Awaitable[None]]
# Before a cluster's runtime stops, while its head still answers: the last copy of its jobs'
# logs (keptlogs/keeper.py). Bounded in time, and never raises.
KeepLogs = Callable[[ClusterRecord], Awaitable[None]]
PREEMPTIBLE_BY_TEARDOWN = ("launch", "start")
# After a stop or down has stopped the agent, how long clients following a job's log get to
# read its final status before the connection closes under them.
FOLLOWER_GRACE_S = 2.0
# How long asking the provider when nodes stopped (for the cost ledger) may take.
PROVIDER_TIME_TIMEOUT_S = 10.0


class Teardown:
    def __init__(self, store: ClusterStore, locks: ClusterLocks, providers: ProviderRegistry,
                 runtime: Runtime, ssh_config: SSHConfigWriter, ledger: Ledger,
                 forget_nodes: ForgetNodes | None = None,
                 storage: StorageService | None = None,
                 keep_logs: KeepLogs | None = None) -> None:
        self._store = store
        self._ledger = ledger
        self._keep_logs = keep_logs
        self._locks = locks
        self._providers = providers
        self._runtime = runtime
        self._ssh_config = ssh_config
        # Drops a torn-down cluster's SSH connections (and its cloud instances' pinned keys).
        self.forget_nodes = forget_nodes
        self._storage = storage

    async def stop(self, request: RunningRequest, name: str, *, reason: str | None = None,
                   precheck: Precheck | None = None) -> dict[str, Any]:
        """Stop the cluster (its runtime, then its nodes). `precheck`, run under the lock,
        may still call it off (it returns why, or None to go on)."""
        record = require_cluster(self._store, name)
        provider = self._providers.get(record.provider)
        if not provider.can_stop:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"{name} runs on {record.provider} machines that clusterd does not own, so "
                "it cannot be stopped",
                f"tear it down instead: clusterctl down {name}",
            )
        self._preempt(request, name)
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "stop",
                                    on_blocked=request.blocked):
            record = require_cluster(self._store, name)
            if record.status == ClusterStatus.STOPPED:
                return {"cluster": name, "status": str(record.status), "changed": False}
            if precheck is not None and (why := await precheck()):
                return {"cluster": name, "status": str(record.status), "changed": False,
                        "skipped": why}
            await request.progress(f"stopping {name}", "stop")
            handle = provider_handle(record, provider)
            info = await provider.cluster_info(record.cloud_name, handle)
            if self._keep_logs is not None:
                await self._keep_logs(record)
            await self._runtime.stop(info)
            await self._runtime.close(name, grace_s=FOLLOWER_GRACE_S)
            await provider.stop(record.cloud_name, handle)
            await self._ledger.stopped(record, await self._gone_at(record, provider))
            await self._store.set_status(name, ClusterStatus.STOPPED,
                                         reason or f"stopped by request {request.id}",
                                         request.id)
        return {"cluster": name, "status": str(ClusterStatus.STOPPED), "changed": True}

    async def down(self, request: RunningRequest, name: str, purge: bool, *,
                   reason: str | None = None, precheck: Precheck | None = None,
                   call_off: bool = False, discard: bool = False) -> dict[str, Any]:
        """Tear the cluster down. With `call_off` (a user's `down`), a launch or start of it
        in progress is called off first, in whatever phase it is: it removes what it made
        (bounded), and the teardown removes the rest. With `discard` (a managed job's lost
        cluster), nodes whose termination takes everything on them along are not reached
        first to stop and clean up the runtime (a partitioned one would hold the teardown up
        for minutes of SSH retries)."""
        require_cluster(self._store, name)
        self._preempt(request, name)
        if call_off:
            me = Holder(request.id, request.op, LockMode.EXCLUSIVE)
            for holder in self._locks.call_off(name, PREEMPTIBLE_BY_TEARDOWN, me):
                await request.progress(f"calling off {holder.describe()} of {name}; it "
                                       "removes what it made first", "down")
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "down",
                                    on_blocked=request.blocked):
            record = self._store.get(name)
            if record is None:  # the launch we called off took its record along
                return {"cluster": name, "status": str(ClusterStatus.TERMINATED),
                        "changed": True}
            if precheck is not None and (why := await precheck()):
                return {"cluster": name, "status": str(record.status), "changed": False,
                        "skipped": why}
            await request.progress(f"tearing down {name}", "down")
            await fault_point("down.mid_teardown")
            targets = await self._teardown(request, record, purge=purge, discard=discard)
            await self._ledger.ended(name, await self._gone_at(record, self._providers.get(
                record.provider)))
            await self._forget(name, targets)
            await self._store.remove(name, reason or f"torn down by request {request.id}",
                                     request.id)
            await self.release_buckets(request, name)
        return {"cluster": name, "status": str(ClusterStatus.TERMINATED), "changed": True}

    async def _gone_at(self, record: ClusterRecord, provider: Provider
                       ) -> tuple[float, ...] | None:
        """When the provider says the cluster's nodes stopped or went, once every one has
        (None: not known, or one still runs): the ledger ends their running stretch then,
        not when the cloud finished stopping them (EC2 bills no stopping instance, and a
        stop can take minutes). One query, bounded; failing, the time is now. Not asked of
        a provider that keeps no such times (local, ssh)."""
        if record.handle.provider is None or not provider.keeps_node_times:
            return None
        try:
            with anyio.fail_after(PROVIDER_TIME_TIMEOUT_S):
                nodes = await provider.query(record.cloud_name, record.handle.provider)
        except (ProtocolError, TimeoutError) as exc:
            logger.info("no provider time for the cost ledger", cluster=record.name,
                        error=exc.message if isinstance(exc, ProtocolError) else "timed out")
            return None
        if any(n.status not in (NodeStatus.STOPPED, NodeStatus.TERMINATED) for n in nodes):
            return None
        return node_times(nodes)

    async def discard_failed_launch(
        self, request: RunningRequest, name: str, error: BaseException
    ) -> None:
        """A launch that never got the cluster UP leaves nothing behind: no runtime, no
        nodes, no record (its events stay, saying why)."""
        record = self._store.get(name)
        if record is None or record.ever_up:
            return
        reason = brief(error.message if isinstance(error, ProtocolError) else repr(error))
        try:
            # Not purged: if what it made cannot be removed now, the record stays (INIT,
            # saying why) so that nothing it made is lost track of.
            with anyio.fail_after(600):
                targets = await self._teardown(request, record, purge=False)
        except Exception as exc:
            why = brief(exc.message if isinstance(exc, ProtocolError) else repr(exc))
            logger.warning("cleanup after failed launch failed", error=why)
            await self._store.set_status(
                name, ClusterStatus.INIT, f"launch failed ({reason}) and cleanup failed "
                f"({why}): `clusterctl down {name}` tries again", request.id)
            return
        await self._ledger.ended(name)
        await self._forget(name, targets)
        await self._store.remove(name, f"launch failed: {reason}", request.id)
        await self.release_buckets(request, name)

    async def release_buckets(self, request: RunningRequest, name: str) -> dict[str, Any]:
        """The cluster (or bucket owner) is gone: `persistent: false` buckets clusterd made for
        it go too (when no other cluster or owner uses them). A bucket that cannot be deleted
        is a warning: its record stays for `clusterctl storage delete`."""
        if self._storage is None:
            return {"released": name, "problems": []}
        try:
            with anyio.fail_after(600):
                problems = await self._storage.release(name)
        except (ProtocolError, TimeoutError) as exc:
            problems = [exc.message if isinstance(exc, ProtocolError) else "timed out"]
        for problem in problems:
            await request.progress(f"warning: {problem}; `clusterctl storage delete` tries "
                                   "again", "down")
        return {"released": name, "problems": problems}

    async def _forget(self, name: str, targets: list[SSHTarget]) -> None:
        """The cluster is gone: its `ssh CLUSTER` configuration and SSH connections too."""
        self._ssh_config.remove(name)
        if self.forget_nodes is not None:
            await self.forget_nodes(targets)

    def _preempt(self, request: RunningRequest, name: str) -> None:
        me = Holder(request.id, request.op, LockMode.EXCLUSIVE)
        for holder in self._locks.preempt_waiting(name, PREEMPTIBLE_BY_TEARDOWN, me):
            logger.info("pre-empted queued request", preempted=holder.request_id)

    async def _teardown(self, request: RunningRequest, record: ClusterRecord,
                        purge: bool, discard: bool = False) -> list[SSHTarget]:
        """Stop, clean up and terminate; returns how its nodes were reached (to forget)."""
        provider = self._providers.get(record.provider)
        handle = record.handle.provider
        if handle is None:
            await self._runtime.close(record.name)
            intent = record.handle.intent
            if intent is not None:
                # A launch died around its create call: sweep whatever it may have made.
                await self._cleanup_cloud(
                    request, record, provider,
                    provider.handle_for_intent(record.cloud_name, intent), purge)
            return []
        try:
            info = await provider.cluster_info(record.cloud_name, handle)
        except ProvisionError as exc:
            info = None
            await request.progress(f"warning: cannot reach the nodes: {exc.message}", "down")
        every = info
        never_ran = not record.ever_up and record.handle.runtime is None
        if never_ran or (discard and provider.terminate_discards_nodes):
            # Nodes not worth reaching (nor asking the provider which can be reached): a
            # launch cut short before the runtime's first start (waiting for the nodes, or
            # installing) ran and wrote nothing there, and nodes that never answered would
            # hold the teardown up for nothing; a discarded cluster's nodes go with all on
            # them when terminated.
            info = None
        if info is not None:
            info = await self._reachable_part(record, provider, handle, info)
        if info is not None:
            if self._keep_logs is not None and record.handle.runtime is not None:
                await self._keep_logs(record)
            try:
                await self._runtime.stop(info)
                await self._runtime.remove_files(record.cloud_name, info)
            except ProtocolError as exc:
                if not purge:
                    raise
                await request.progress(f"warning: runtime cleanup failed: {exc.message}", "down")
        await self._runtime.close(record.name, grace_s=FOLLOWER_GRACE_S)
        await self._cleanup_cloud(request, record, provider, handle, purge)
        return [node.ssh for node in (every.nodes if every else ()) if node.ssh is not None]

    async def _reachable_part(self, record: ClusterRecord, provider: Provider,
                              handle: ProviderHandle, info: ClusterInfo
                              ) -> ClusterInfo | None:
        """The nodes worth stopping the runtime on: not the ones gone for good (a preempted
        worker) or stopped, and none if the head is (Ray's workers die with it)."""
        try:
            nodes = await provider.query(record.cloud_name, handle)
        except ProtocolError:
            return info
        # Stopped machines answer no SSH (this one, `local`, is always there).
        gone = {n.node_id for n in nodes if n.status == NodeStatus.TERMINATED
                or (n.status == NodeStatus.STOPPED and n.ssh is not None)}
        alive = tuple(n for n in info.nodes if n.node_id not in gone)
        if not alive or alive[0] is not info.head:
            return None
        return dataclasses.replace(info, nodes=alive)

    async def _cleanup_cloud(self, request: RunningRequest, record: ClusterRecord,
                             provider: Provider, handle: ProviderHandle, purge: bool) -> None:
        for step in (provider.terminate, provider.cleanup_ports):
            try:
                await step(record.cloud_name, handle)
            except ProtocolError as exc:
                if not purge:
                    raise
                await request.progress(f"warning: {exc.message}", "down")
            await fault_point("down.mid_terminate")
