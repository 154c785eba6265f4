"""Executing a launch's steps: what provision/plan.py decides, done.

`bring_up` asks `decide` for the next step and executes it until the cluster is UP (or the
launch fails); each step's crash-safety rule is written beside it in provision/plan.py. Order
matters for crash safety: a new cluster's record (with the name the provider will know it by)
is written before any provider call that creates something, so a daemon killed at any instant
finds what it started.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable

import anyio

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.cost.ledger import Ledger, node_times
from clusterd.locks import ClusterLocks
from clusterd.nodes import NodeStatus
from clusterd.providers.base import Provider, ProviderHandle, ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.candidates import candidates
from clusterd.provision.failover import Attempt, Option
from clusterd.provision.launcher import NoPlacement, Provisioned, Provisioner
from clusterd.provision.plan import (
    FINAL,
    LaunchPlan,
    LaunchRequest,
    Observed,
    Step,
    decide,
    placement_of,
)
from clusterd.requests import RunningRequest
from clusterd.services.common import (
    announce_warnings,
    cloud_name_for,
    fit_to_cluster,
    provider_handle,
)
from clusterd.services.jobs import JobService
from clusterd.services.node_runtime import Runtime
from clusterd.services.teardown import Teardown
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.handles import ClusterHandle, RuntimeHandle
from clusterd.storage.service import StorageService
from clusterd.tasks.spec import Autostop, Resources, TaskSpec


class Warnings:
    """Task fields without effect, each said once, as soon as it is known (before any node
    is made, where it can be)."""

    def __init__(self, request: RunningRequest, store: ClusterStore, name: str) -> None:
        self._request = request
        self._store = store
        self._name = name
        self._said: set[str] = set()

    async def __call__(self, warnings: Iterable[str]) -> None:
        new = [w for w in dict.fromkeys(warnings) if w not in self._said]
        self._said.update(new)
        await announce_warnings(self._request, self._store, self._name, new)


class LaunchSteps:
    def __init__(self, store: ClusterStore, locks: ClusterLocks, providers: ProviderRegistry,
                 runtime: Runtime, jobs: JobService, ssh_config: SSHConfigWriter,
                 provisioner: Provisioner, teardown: Teardown, ledger: Ledger,
                 storage: StorageService | None = None) -> None:
        self._store = store
        self._ledger = ledger
        self._locks = locks
        self._providers = providers
        self._runtime = runtime
        self._jobs = jobs
        self._ssh_config = ssh_config
        self._provisioner = provisioner
        self._teardown = teardown
        self._storage = storage

    async def launch(self, request: RunningRequest, launch: LaunchRequest,
                     warn: Warnings) -> tuple[ClusterRecord, Resources]:
        """The cluster UP, new or existing, and the task's resources it meets."""
        record = self._store.get(launch.name)
        if record is None:
            record, resources, landed = await self._new(request, launch, warn)
            await warn(landed)
            return record, resources
        resources, fitting = fit_to_cluster(
            record, launch.task, self._providers.honoured_fields(record.provider),
            launch.infra, launch.strict)
        await warn([*launch.task.warnings, *fitting])
        return await self.bring_up(request, launch, record), resources

    async def bring_up(self, request: RunningRequest, launch: LaunchRequest | None,
                       record: ClusterRecord) -> ClusterRecord:
        """An existing cluster UP (`launch` None: a `start`): look until `decide` has a step
        that brings it up, then take that step."""
        provider = self._providers.get(record.provider)
        observed = Observed()
        while (step := decide(launch, record, observed)) not in FINAL:
            if step == Step.CHECK_NODES:
                observed = dataclasses.replace(
                    observed, lost_nodes=await self._lost_nodes(record, provider))
            elif step == Step.CHECK_RUNTIME:
                observed = dataclasses.replace(observed,
                                               runtime=await self._runtime.health(record))
            else:  # WAIT
                await request.progress(f"waiting for the nodes of {record.name} to run",
                                       "provision")
                handle = provider_handle(record, provider)
                record, _ = await self._provisioner.wait_for_nodes(record, provider, handle)
                observed = dataclasses.replace(observed, waited=True)
        retry = launch is not None and launch.retry_until_up
        if step == Step.START:
            return await self._start(request, record, provider)
        if step == Step.RESUME:
            # An earlier launch died before the provider answered: create is idempotent,
            # and the attempt it was making goes first.
            await request.progress(f"resuming the interrupted launch of {record.name}",
                                   "resume")
            done = await self._provisioner.provision(request, record, LaunchPlan.resume(record),
                                                     retry_until_up=retry)
            return await self.start_runtime(request, done, "launched")
        if step == Step.RECREATE:
            return await self._recreate(request, record, retry)
        if step == Step.REUSE:
            await request.progress(f"cluster {record.name} is UP; reusing it", "up")
            return record
        if step == Step.UPGRADE:
            await request.progress(f"upgrading the runtime of {record.name} to this version",
                                   "repair")
        else:
            await request.progress(f"repairing the runtime of {record.name}", "repair")
        here = Provisioned(record, provider, provider_handle(record, provider), Resources())
        return await self.start_runtime(request, here, "repaired", fresh=step == Step.UPGRADE)

    async def start_runtime(self, request: RunningRequest, done: Provisioned, verb: str, *,
                            fresh: bool = False, previous: RuntimeHandle | None = None
                            ) -> ClusterRecord:
        """The runtime up on the cluster's nodes, then the record UP; `previous` is the
        runtime handle of what may still run there (else the record's)."""
        record, provider, handle = done.record, done.provider, done.handle
        info = await provider.cluster_info(record.cloud_name, handle)
        # The nodes run (and cost) from here on: from when the provider started them, where
        # it says (an EC2 instance's LaunchTime, before it booted and answered SSH).
        await self._ledger.running(record, at=node_times(info.nodes))

        async def checkpoint(runtime: RuntimeHandle) -> None:
            await self._store.update(record.name, handle=ClusterHandle(
                provider=handle, runtime=runtime))

        runtime = await self._runtime.up(record, info, previous or record.handle.runtime,
                                         request.progress, fresh=fresh, checkpoint=checkpoint)
        self._ssh_config.write(record.name, list(info.nodes))
        record = await self._store.set_status(
            record.name, ClusterStatus.UP, f"{verb} by request {request.id}", request.id,
            handle=ClusterHandle(provider=handle, runtime=runtime,
                                 tunnel=self._runtime.tunnel(record.name)),
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
        handle = record.handle.provider
        if handle is not None:
            await provider.apply_autostop(record.cloud_name, handle,
                                          None if setting is None else setting.down)
        if record.status == ClusterStatus.UP:
            await self._runtime.set_autostop(record, setting)
        if announce:
            text = "autostop cancelled" if setting is None else (
                f"autostop set: {'tear down' if setting.down else 'stop'} after "
                f"{setting.idle_minutes:g} idle min (waiting for {setting.wait_for})")
            await self._store.add_event(record.name, "autostop", text, request_id)
        return record

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
                    await self._teardown.release_buckets(request, name)
            raise
        return regions

    # -- Step.NEW -----------------------------------------------------------------------------

    async def _new(self, request: RunningRequest, launch: LaunchRequest, warn: Warnings
                   ) -> tuple[ClusterRecord, Resources, tuple[str, ...]]:
        """`warn` is told the task's warnings that hold wherever it lands (the task's own,
        and those every first choice shares) before anything is made; the caller says the
        rest once it has landed."""
        name, task = launch.name, launch.task
        found = await candidates(task.resource_options(), launch.infra, self._providers)
        where = ", ".join(dict.fromkeys(str(c.resources.infra) for c in found)) or "nowhere"
        await request.progress(f"checking where {name} can run ({where})", "placement")
        plan = LaunchPlan.new(launch, cloud_name_for(name), found)
        first = await plan.round(self._providers)
        for refusal in first[1]:
            await request.progress(f"{refusal.infra} ({refusal.resources}): "
                                   f"{refusal.reason.splitlines()[0]} — not trying it", "failover")
        if not first[0] and not launch.retry_until_up:
            raise NoPlacement(name, first[1])
        shared = [w for w in first[0][0].warnings
                  if all(w in option.warnings for option in first[0])] if first[0] else []
        await warn([*task.warnings, *shared])
        now = time.time()
        record = ClusterRecord(
            name=name,
            provider=first[0][0].placement.provider if first[0] else found[0].provider,
            cloud_name=plan.cloud_name,
            status=ClusterStatus.INIT,
            num_nodes=task.num_nodes,
            requested_resources=task.request(),
            config_hash=task.config_hash(),
            created_at=now,
            status_updated_at=now,
            launch_request_id=request.id,
            autostop_down=plan.autostop_down,
            owner=launch.owner,
        )
        # The record (with the name the provider will know it by) is on disk before the
        # provider is asked to create anything.
        await self._store.insert(record, f"launch requested by request {request.id}", request.id)
        done = await self._provision_new(request, launch, record, plan, first)
        return done.record, done.resources, done.warnings

    async def _provision_new(self, request: RunningRequest, launch: LaunchRequest,
                             record: ClusterRecord, plan: LaunchPlan,
                             first: tuple[list[Option], list[Attempt]]) -> Provisioned:
        """Nodes and runtime for the new cluster; a launch that fails (or that `down` calls
        off) removes what it made."""
        name = record.name
        try:
            done = await self._provisioner.provision(
                request, record, plan, first=first, retry_until_up=launch.retry_until_up,
                steering=launch.steering)
            up = await self.start_runtime(request, done, "launched")
            return dataclasses.replace(done, record=up)
        except anyio.get_cancelled_exc_class():
            with anyio.CancelScope(shield=True):
                by = self._locks.called_off(name, request.id)
                if by is not None:
                    # `down` called it off: remove what it made (bounded), as a failed
                    # launch does; down then removes whatever this could not.
                    await request.progress(f"called off by {by.describe()}; removing what "
                                           "the launch made", "down")
                    await self._teardown.discard_failed_launch(
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
                await self._teardown.discard_failed_launch(request, name, exc)
            raise

    # -- the steps of an existing cluster -------------------------------------------------------

    async def _start(self, request: RunningRequest, record: ClusterRecord,
                     provider: Provider) -> ClusterRecord:
        await request.progress(f"starting stopped cluster {record.name}", "start")
        try:
            handle = await provider.start(record.cloud_name, provider_handle(record, provider))
        except ProvisionError as exc:
            raise _not_where_it_lives(record, exc) from None
        return await self.start_runtime(
            request, Provisioned(record, provider, handle, Resources()), "started")

    async def _lost_nodes(self, record: ClusterRecord, provider: Provider) -> bool:
        """Whether nodes of the cluster are gone for good (a spot node preempted, say)."""
        handle: ProviderHandle = provider_handle(record, provider)
        try:
            nodes = await provider.query(record.cloud_name, handle)
        except ProtocolError:
            return False
        alive = [n for n in nodes if n.status != NodeStatus.TERMINATED]
        return len(alive) < record.num_nodes

    async def _recreate(self, request: RunningRequest, record: ClusterRecord,
                        retry_until_up: bool) -> ClusterRecord:
        """A cluster that was UP comes back only where it lives (its disks hold the user's
        data): the missing nodes are made again there, or the launch fails saying so."""
        where = placement_of(record).describe()
        await request.progress(f"{record.name} lost nodes; making them again in {where}",
                               "repair")
        try:
            done = await self._provisioner.provision(request, record,
                                                     LaunchPlan.in_place(record),
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
        return await self.start_runtime(request, done, "repaired",
                                        previous=record.handle.runtime)


def _not_where_it_lives(record: ClusterRecord, error: ProtocolError) -> ProtocolError:
    where = placement_of(record).describe()
    return ProtocolError(
        error.code, f"{record.name} cannot come back where it lives ({where}); a cluster "
        f"that was UP is never moved, since its disks hold your data: {error.message}",
        f"try again later, or `clusterctl down {record.name}` and launch it anew",
    )

