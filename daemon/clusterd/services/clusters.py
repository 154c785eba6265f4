"""Cluster lifecycle: launch, start, stop and down (status views: status_views.py).

Order matters for crash safety: a cluster's record (with the name the provider will know it
by) is written before any provider call that creates something, so a daemon killed at any
instant finds what it started. Teardown stops the runtime first (the agent cancels its jobs,
so clients following their logs learn how they ended), then closes the agent connection (and
its tunnel), then terminates and cleans up, and only then forgets the record.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Awaitable, Callable, Iterable
from typing import Any, Literal

import anyio

from clusterctl.protocol import ClusterStatus, ErrorCode, LaunchArgs, ProtocolError, clipped
from clusterd import log
from clusterd.faults import fault_point
from clusterd.locks import ClusterLocks, Holder, LockMode
from clusterd.nodes import ClusterInfo, NodeStatus, SSHTarget
from clusterd.providers.base import (
    ClusterRequest,
    Provider,
    ProviderHandle,
    ProvisionError,
)
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.candidates import candidates, plan
from clusterd.provision.failover import Attempt, Option, Steering
from clusterd.provision.launcher import (
    Plan,
    Provisioner,
    intent_first,
    no_placement,
    placement_of,
)
from clusterd.requests import RunningRequest
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_types import AutostopSetting, as_wait_for
from clusterd.runtime.manager import RuntimeManager
from clusterd.services.common import (
    announce_warnings,
    cloud_name_for,
    fit_to_cluster,
    provider_handle,
    refuse_other_owner,
    require_cluster,
)
from clusterd.services.jobs import JobService
from clusterd.services.status_views import StatusViews
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.handles import ClusterHandle, RuntimeHandle
from clusterd.storage.s3 import StorageError
from clusterd.storage.service import StorageService
from clusterd.tasks.spec import Autostop, Infra, Resources, TaskSpec, choices_from_view

logger = log.get("clusterd.clusters")

WAIT_TIMEOUT_S = 900.0
# Run under a cluster's lock just before a stop or down; returns why to call it off, or None.
Precheck = Callable[[], Awaitable[str | None]]
PREEMPTIBLE_BY_TEARDOWN = ("launch", "start")
# After a stop or down has stopped the agent, how long clients following a job's log get to
# read its final status before the connection closes under them.
FOLLOWER_GRACE_S = 2.0


class ClusterService:
    def __init__(
        self,
        store: ClusterStore,
        locks: ClusterLocks,
        providers: ProviderRegistry,
        runtime: RuntimeManager,
        access: AgentAccess,
        jobs: JobService,
        ssh_config: SSHConfigWriter,
        provisioner: Provisioner,
        forget_nodes: Callable[[list[SSHTarget]], Awaitable[None]] | None = None,
        storage: StorageService | None = None,
    ) -> None:
        self._ssh_config = ssh_config
        self._storage = storage
        self._provisioner = provisioner
        # Drops a torn-down cluster's SSH connections (and its cloud instances' pinned keys).
        self._forget_nodes = forget_nodes
        # Cluster -> the autostop request stopping it right now (kept by the autostop service;
        # `status` shows these as autostopping).
        self.autostopping: dict[str, int] = {}
        self.views = StatusViews(store, locks, self.autostopping)
        self._store = store
        self._locks = locks
        self._providers = providers
        self._runtime = runtime
        self._access = access
        self._jobs = jobs

    # -- launch -----------------------------------------------------------------------------

    async def launch(
        self, request: RunningRequest, name: str, args: LaunchArgs, task: TaskSpec,
        steering: Steering | None = None, owner: str | None = None,
    ) -> dict[str, Any]:
        """`steering` (a managed job's relaunch) orders a new cluster's first round.
        `owner` (a managed job's tag; None for the user) is recorded as the creator of a new
        cluster, and only a launch of the same owner may use an existing one: neither takes
        the other's. It also holds the buckets clusterd makes for the task as well as the
        cluster does: they outlive the cluster until the owner releases them."""
        override = Infra.parse(args.infra) if args.infra else None
        autostop = _autostop_setting(args, task)
        # Before the lock and before any node is made: a copy that must not happen fails
        # the launch at once.
        copy_warnings = await self._jobs.check_copies(task, strict=args.strict)
        created = False
        unmountable: StorageError | None = None
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "launch",
                                    on_blocked=request.blocked) as grant:
            # `down` calls it off in whatever phase it is (see _provision_new for what a
            # new cluster's launch removes then; an existing cluster is down's to remove).
            with grant.interruptible(f"launch {name} again once that finishes"):
                refuse_other_owner(self._store.get(name), owner)
                # Buckets first: a missing one fails the launch before any node is made.
                regions = await self.prepare_buckets(request, name, task, owner)
                record = self._store.get(name)
                # Warnings are said as soon as they are known, before any node is made.
                said: set[str] = set()

                async def warn(warnings: Iterable[str]) -> None:
                    new = [w for w in dict.fromkeys(warnings) if w not in said]
                    said.update(new)
                    await announce_warnings(request, self._store, name, new)

                await warn(copy_warnings)
                if record is None:
                    created = True
                    record, resources, landed = await self._provision_new(
                        request, name, task, override, autostop, args.retry_until_up,
                        args.strict, steering, warn, owner)
                    await warn(landed)
                else:
                    resources, fitting = fit_to_cluster(
                        record, task, self._providers.honoured_fields(record.provider),
                        override, args.strict)
                    await warn([*task.warnings, *fitting])
                    provider = self._providers.get(record.provider)
                    record = await self._bring_existing_up(request, record, provider,
                                                           args.retry_until_up)
                if autostop is not None:
                    record = await self.apply_autostop(record, autostop, request.id)
                grant.downgrade()
                job_task = dataclasses.replace(task, resources=resources, resource_choices=())
                try:
                    result = await self._jobs.submit(request, record, job_task,
                                                     run_setup=True, bucket_regions=regions)
                except StorageError as exc:
                    if not created:
                        raise
                    unmountable = exc
        if unmountable is not None:
            # A new cluster that cannot have the task's buckets (no FUSE on its nodes, say)
            # goes with its failed launch, and the buckets made for it with it.
            await request.progress(f"{name} cannot have the task's buckets; tearing it down",
                                   "down")
            with anyio.CancelScope(shield=True):
                await self.down(request, name, purge=False,
                                reason=f"launch failed: {brief(unmountable.message)}")
            raise unmountable
        return result

    async def _provision_new(
        self, request: RunningRequest, name: str, task: TaskSpec, override: Infra | None,
        autostop: Autostop | None, retry_until_up: bool, strict: bool,
        steering: Steering | None = None,
        warn: Callable[[Iterable[str]], Awaitable[None]] | None = None,
        owner: str | None = None,
    ) -> tuple[ClusterRecord, Resources, tuple[str, ...]]:
        """`warn` is told the task's warnings that hold wherever it lands (the task's own,
        and those every first choice shares) before anything is made; the caller says the
        rest once it has landed."""
        cloud_name = cloud_name_for(name)
        autostop_down = bool(autostop and autostop.down)
        found = await candidates(task.resource_options(), override, self._providers)
        where = ", ".join(dict.fromkeys(str(c.resources.infra) for c in found)) or "nowhere"
        await request.progress(f"checking where {name} can run ({where})", "placement")

        async def planner() -> tuple[list[Option], list[Attempt]]:
            return await plan(found, self._providers, name, cloud_name, task.num_nodes,
                              autostop_down, task.choices_ordered, strict)

        first = await planner()
        for refusal in first[1]:
            await request.progress(f"{refusal.infra} ({refusal.resources}): "
                                   f"{refusal.reason.splitlines()[0]} — not trying it", "failover")
        if not first[0] and not retry_until_up:
            raise no_placement(name, first[1])
        if warn is not None:
            shared = [w for w in first[0][0].warnings
                      if all(w in option.warnings for option in first[0])] if first[0] else []
            await warn([*task.warnings, *shared])
        now = time.time()
        record = ClusterRecord(
            name=name,
            provider=first[0][0].placement.provider if first[0] else found[0].provider,
            cloud_name=cloud_name,
            status=ClusterStatus.INIT,
            num_nodes=task.num_nodes,
            requested_resources=task.requested_view(),
            config_hash=task.config_hash(),
            created_at=now,
            status_updated_at=now,
            launch_request_id=request.id,
            autostop_down=autostop_down,
            owner=owner,
        )
        # The record (with the name the provider will know it by) is on disk before the
        # provider is asked to create anything.
        await self._store.insert(record, f"launch requested by request {request.id}", request.id)
        try:
            done = await self._provisioner.provision(request, record, planner, first=first,
                                                     retry_until_up=retry_until_up,
                                                     steering=steering)
            record = await self._start_runtime(request, done.record, done.provider,
                                               done.handle, "launched")
            return record, done.resources, done.warnings
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                by = self._locks.called_off(name, request.id)
                if by is not None:
                    # `down` called it off: remove what it made (bounded), as a failed
                    # launch does; down then removes whatever this could not.
                    await request.progress(f"called off by {by.describe()}; removing what "
                                           "the launch made", "down")
                    await self._discard_failed_launch(
                        request, name, ProtocolError(ErrorCode.PREEMPTED,
                                                     f"called off by {by.describe()}"))
                # Else the daemon is shutting down: keep the intent; the next start
                # reconciles it.
                elif self._store.get(name) is not None:
                    await self._store.set_status(
                        name, ClusterStatus.INIT,
                        f"launch interrupted by a daemon shutdown; `clusterctl launch -c {name}`"
                        " finishes it", request.id)
            raise
        except BaseException as exc:
            with anyio.CancelScope(shield=True):
                await self._discard_failed_launch(request, name, exc)
            raise

    async def _start_runtime(
        self,
        request: RunningRequest,
        record: ClusterRecord,
        provider: Provider,
        provider_handle: ProviderHandle,
        verb: str,
        *,
        fresh: bool = False,
        previous: RuntimeHandle | None = None,
    ) -> ClusterRecord:
        """Ray and the agent up on the cluster's nodes; `previous` is the runtime handle of
        what may still run there (else the record's)."""
        info = await provider.cluster_info(record.cloud_name, provider_handle)
        previous = previous or record.handle.runtime

        async def checkpoint(runtime: RuntimeHandle) -> None:
            await self._store.update(record.name, handle=ClusterHandle(
                provider=provider_handle, runtime=runtime))

        runtime = await self._runtime.up(record.name, record.cloud_name, info, previous,
                                         request.progress, fresh=fresh, checkpoint=checkpoint)
        self._ssh_config.write(record.name, list(info.nodes))
        record = await self._store.set_status(
            record.name,
            ClusterStatus.UP,
            f"{verb} by request {request.id}",
            request.id,
            handle=ClusterHandle(provider=provider_handle, runtime=runtime,
                                 tunnel=self._access.tunnels.describe(record.name)),
            launched_at=record.launched_at or time.time(),
            refreshed_at=time.time(),
        )
        if record.autostop_minutes is not None:
            # A restarted runtime's agent learns the setting again; the clock starts over.
            record = await self.apply_autostop(
                record, Autostop(record.autostop_minutes, record.autostop_down,
                                 record.autostop_wait_for), request.id, announce=False)
        if verb in ("started", "repaired"):
            # A node made again has none of the bucket mounts its peers have.
            await self._jobs.restore_buckets(request, record, info)
        await request.progress(f"cluster {record.name} is UP", "up")
        return record

    async def _discard_failed_launch(
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
        if self._forget_nodes is not None:
            await self._forget_nodes(targets)
        self._ssh_config.remove(name)
        await self._store.remove(name, f"launch failed: {reason}", request.id)
        await self.release_buckets(request, name)

    async def _bring_existing_up(
        self, request: RunningRequest, record: ClusterRecord, provider: Provider,
        retry_until_up: bool = False,
    ) -> ClusterRecord:
        handle = record.handle.provider
        if record.status == ClusterStatus.STOPPED:
            await request.progress(f"starting stopped cluster {record.name}", "start")
            try:
                handle = await provider.start(record.cloud_name,
                                              provider_handle(record, provider))
            except ProvisionError as exc:
                raise _not_where_it_lives(record, exc) from None
            return await self._start_runtime(request, record, provider, handle, "started")
        if handle is None:
            # An earlier launch died before the provider answered: create is idempotent,
            # and the attempt it was making goes first.
            await request.progress(f"resuming the interrupted launch of {record.name}", "resume")
            done = await self._provisioner.provision(
                request, record, self._resume_plan(record), retry_until_up=retry_until_up)
            return await self._start_runtime(request, done.record, done.provider, done.handle,
                                             "launched")
        if record.ever_up and await self._lost_nodes(record, provider, handle):
            return await self._recreate_in_place(request, record, retry_until_up)
        if not record.ever_up:
            # An earlier launch may have died after its create, before its nodes ran.
            await request.progress(f"waiting for the nodes of {record.name} to run",
                                   "provision")
            record, handle = await self._provisioner.wait_for_nodes(record, provider, handle)
        health = await self._runtime_health(record)
        if record.status == ClusterStatus.UP and health == "healthy":
            await request.progress(f"cluster {record.name} is UP; reusing it", "up")
            return record
        if health == "other version":
            await request.progress(f"upgrading the runtime of {record.name} to this version",
                                   "repair")
        else:
            await request.progress(f"repairing the runtime of {record.name}", "repair")
        return await self._start_runtime(request, record, provider, handle, "repaired",
                                         fresh=health == "other version")

    def _resume_plan(self, record: ClusterRecord) -> Plan:
        base = Resources.from_view(record.requested_resources)
        choices, ordered = choices_from_view(record.requested_resources)
        intent = record.handle.intent

        async def planner() -> tuple[list[Option], list[Attempt]]:
            found = await candidates(choices or (base,), None, self._providers)
            options, refusals = await plan(found, self._providers, record.name,
                                           record.cloud_name, record.num_nodes,
                                           record.autostop_down, ordered)
            return intent_first(options, intent, record), refusals

        return planner

    async def _lost_nodes(self, record: ClusterRecord, provider: Provider,
                          handle: ProviderHandle) -> bool:
        """Whether nodes of the cluster are gone for good (a spot node preempted, say)."""
        try:
            nodes = await provider.query(record.cloud_name, handle)
        except ProtocolError:
            return False
        alive = [n for n in nodes if n.status != NodeStatus.TERMINATED]
        return len(alive) < record.num_nodes

    async def _recreate_in_place(self, request: RunningRequest, record: ClusterRecord,
                                 retry_until_up: bool) -> ClusterRecord:
        """A cluster that was UP comes back only where it lives (its disks hold the user's
        data): the missing nodes are made again there, or the launch fails saying so."""
        placement = placement_of(record)
        where = placement.describe()
        await request.progress(f"{record.name} lost nodes; making them again in {where}",
                               "repair")

        async def planner() -> tuple[list[Option], list[Attempt]]:
            resources = dataclasses.replace(
                Resources.from_view(record.requested_resources),
                infra=Infra(placement.provider, placement.region, placement.zone))
            request_ = ClusterRequest(record.name, record.cloud_name, record.num_nodes,
                                      resources, autostop_down=record.autostop_down,
                                      previous=record.handle.provider)
            return [Option(placement, request_)], []

        try:
            done = await self._provisioner.provision(request, record, planner,
                                                     retry_until_up=retry_until_up)
        except ProtocolError as exc:
            now = self._store.get(record.name)
            if now is not None and now.handle.provider is None:
                # The create failed (no capacity, say) and removed what it made: the cluster
                # is what it was (its surviving nodes, their runtime), so that the next launch
                # repairs it again, rather than resume a launch that made nothing.
                await self._store.update(record.name, handle=record.handle)
            raise _not_where_it_lives(record, exc) from None
        # The nodes that survived still run Ray and the agent (with the job queue): keep them,
        # on the ports recorded before provisioning rewrote the handle; only new nodes start.
        return await self._start_runtime(request, done.record, done.provider, done.handle,
                                         "repaired",
                                         previous=record.handle.runtime)

    async def _runtime_health(
        self, record: ClusterRecord
    ) -> Literal["healthy", "other version", "unhealthy"]:
        """Whether the runtime can be reused; "other version": an agent of another clusterd."""
        try:
            agent = await self._access.client(record)
            health = await agent.check_version()
        except ProtocolError as exc:
            await self._access.reset(record.name)
            return "other version" if exc.code == ErrorCode.AGENT_VERSION_MISMATCH else (
                "unhealthy")
        if health.ray_connected and health.ray_nodes_alive >= record.num_nodes:
            return "healthy"
        return "unhealthy"

    async def apply_autostop(self, record: ClusterRecord, setting: Autostop | None,
                             request_id: int | None = None, *, announce: bool = True
                             ) -> ClusterRecord:
        """Set (None: cancel) autostop: in the record (deadlines survive restarts) and in the
        agent (which enforces it itself when no daemon comes by). The caller holds the lock."""
        provider = self._providers.get(record.provider)
        if (setting is not None and not provider.can_stop and not setting.down
                and provider.autostop_tears_down):
            setting = dataclasses.replace(setting, down=True)
        if setting is not None and not provider.can_stop and not setting.down:
            raise ProtocolError(
                ErrorCode.UNSUPPORTED,
                f"{record.provider} clusters cannot be stopped, so autostop needs --down",
                "add --down to tear the cluster down when idle",
            )
        now = time.time()
        if setting is None:
            record = await self._store.update(record.name, autostop_minutes=None,
                                              autostop_set_at=None, autostop_deadline=None)
        else:
            record = await self._store.update(
                record.name, autostop_minutes=setting.idle_minutes, autostop_down=setting.down,
                autostop_wait_for=setting.wait_for, autostop_set_at=now,
                autostop_deadline=now + setting.idle_minutes * 60,
            )
        provider_handle = record.handle.provider
        if provider_handle is not None:
            await provider.apply_autostop(record.cloud_name, provider_handle,
                                          None if setting is None else setting.down)
        if record.status == ClusterStatus.UP:
            agent = await self._access.client(record)
            await agent.set_autostop(
                AutostopSetting(None) if setting is None else AutostopSetting(
                    setting.idle_minutes, setting.down, as_wait_for(setting.wait_for)))
        if announce:
            text = "autostop cancelled" if setting is None else (
                f"autostop set: {'tear down' if setting.down else 'stop'} after "
                f"{setting.idle_minutes:g} idle min (waiting for {setting.wait_for})")
            await self._store.add_event(record.name, "autostop", text, request_id)
        return record

    # -- start / stop / down ------------------------------------------------------------------

    async def start(self, request: RunningRequest, name: str) -> dict[str, Any]:
        require_cluster(self._store, name)
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "start",
                                    on_blocked=request.blocked) as grant:
            with grant.interruptible(f"start {name} again once that finishes"):
                record = require_cluster(self._store, name)
                provider = self._providers.get(record.provider)
                record = await self._bring_existing_up(request, record, provider)
        return {"cluster": name, "status": str(record.status)}

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
            await self._runtime.stop(info)
            await self._access.close(name, grace_s=FOLLOWER_GRACE_S)
            await provider.stop(record.cloud_name, handle)
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
            self._ssh_config.remove(name)
            if self._forget_nodes is not None:
                await self._forget_nodes(targets)
            await self._store.remove(name, reason or f"torn down by request {request.id}",
                                     request.id)
            await self.release_buckets(request, name)
        return {"cluster": name, "status": str(ClusterStatus.TERMINATED), "changed": True}

    async def prepare_buckets(self, request: RunningRequest, name: str,
                              task: TaskSpec, owner: str | None = None
                              ) -> dict[str, str] | None:
        """Each bucket's region once they all exist (None: the task mounts none)."""
        if not task.bucket_mounts or self._storage is None:
            return None

        async def progress(message: str) -> None:
            await request.progress(message, "storage")

        try:
            regions = await self._storage.prepare(name, task.bucket_mounts, progress)
            if owner is not None:
                await self._storage.hold(owner, task.bucket_mounts)
        except BaseException:
            if self._store.get(name) is None:  # nothing uses what it made
                with anyio.CancelScope(shield=True):
                    await self.release_buckets(request, name)
            raise
        return regions

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
            await self._access.close(record.name)
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
            try:
                await self._runtime.stop(info)
                await self._runtime.remove_files(record.cloud_name, info)
            except ProtocolError as exc:
                if not purge:
                    raise
                await request.progress(f"warning: runtime cleanup failed: {exc.message}", "down")
        await self._access.close(record.name, grace_s=FOLLOWER_GRACE_S)
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

    async def cluster_info(self, record: ClusterRecord) -> ClusterInfo:
        return await self._jobs.cluster_info(record)

    def provision_stats(self) -> dict[str, float]:
        return self._provisioner.stats()

    def forget_config(self, name: str) -> None:
        """The cluster is gone: so is its `ssh CLUSTER` configuration."""
        self._ssh_config.remove(name)
    async def forget_nodes(self, record: ClusterRecord) -> None:
        """Drop the SSH connections of a cluster found gone (best effort)."""
        if self._forget_nodes is None or not record.handle.provider:
            return
        try:
            info = await self.cluster_info(record)
        except ProtocolError:
            return
        await self._forget_nodes([n.ssh for n in info.nodes if n.ssh is not None])


def brief(message: str, limit: int = 300) -> str:
    """An error fit for an event: its first line and, when a log tail follows, its last."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return clipped(text, limit)


def _not_where_it_lives(record: ClusterRecord, error: ProtocolError) -> ProtocolError:
    where = placement_of(record).describe()
    return ProtocolError(
        error.code, f"{record.name} cannot come back where it lives ({where}); a cluster "
        f"that was UP is never moved, since its disks hold your data: {error.message}",
        f"try again later, or `clusterctl down {record.name}` and launch it anew",
    )


def _autostop_setting(args: LaunchArgs, task: TaskSpec) -> Autostop | None:
    if args.idle_minutes is not None:  # checked (finite, in range) by the handler
        return Autostop(args.idle_minutes, args.down)
    if task.resources.autostop is not None:
        setting = task.resources.autostop
        return dataclasses.replace(setting, down=setting.down or args.down)
    if args.down:
        return Autostop(0, True)  # SkyPilot's --down alone: tear down once idle
    return None
