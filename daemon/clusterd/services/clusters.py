"""Cluster lifecycle: launch, start, stop and down, the service handlers and managed jobs call.

A launch takes the cluster's lock, then executes the step provision/plan.py decides for it
(services/launch.py); stop and down are services/teardown.py's; status views are
status_views.py's. Crash safety: see provision/plan.py (each step's rule) and teardown.py.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from clusterctl.protocol import ProtocolError
from clusterd.cost.ledger import Ledger
from clusterd.locks import ClusterLocks, LockMode
from clusterd.nodes import ClusterInfo, SSHTarget
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.launcher import Provisioner
from clusterd.provision.plan import LaunchRequest, refuse_other_owner
from clusterd.requests import RunningRequest
from clusterd.services.common import brief, require_cluster, require_up
from clusterd.services.dry_run import DryRun
from clusterd.services.jobs import JobService
from clusterd.services.launch import LaunchSteps, Warnings
from clusterd.services.node_runtime import Runtime
from clusterd.services.ssh_access import ssh_access
from clusterd.services.status_views import StatusViews
from clusterd.services.teardown import KeepLogs, Precheck, Teardown
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.storage.s3 import StorageError
from clusterd.storage.service import StorageService
from clusterd.tasks.spec import Autostop, TaskSpec

__all__ = ["ClusterService", "Precheck", "brief"]


class ClusterService:
    def __init__(
        self,
        store: ClusterStore,
        locks: ClusterLocks,
        providers: ProviderRegistry,
        runtime: Runtime,
        jobs: JobService,
        ssh_config: SSHConfigWriter,
        provisioner: Provisioner,
        forget_nodes: Callable[[list[SSHTarget]], Awaitable[None]] | None = None,
        storage: StorageService | None = None,
        keep_logs: KeepLogs | None = None,
        *,
        ledger: Ledger,
    ) -> None:
        self.ledger = ledger
        self._ssh_config = ssh_config
        self._provisioner = provisioner
        # Cluster -> the autostop request stopping it right now (kept by the autostop service;
        # `status` shows these as autostopping).
        self.autostopping: dict[str, int] = {}
        self.views = StatusViews(store, locks, self.autostopping)
        self._store = store
        self._locks = locks
        self._jobs = jobs
        self._teardown = Teardown(store, locks, providers, runtime, ssh_config, ledger,
                                  forget_nodes, storage, keep_logs)
        self._steps = LaunchSteps(store, locks, providers, runtime, jobs, ssh_config,
                                  provisioner, self._teardown, ledger, storage)
        # --dryrun: the plan, and nothing made.
        self.dry_run = DryRun(store, providers, jobs.check_copies, ledger.prices)

    async def launch(self, request: RunningRequest, launch: LaunchRequest) -> dict[str, Any]:
        """The cluster UP (made, started, resumed, repaired or reused: provision/plan.py
        decides), then the task submitted to it. A user's launch and a managed job's
        (`launch.owner` set; only it may use the cluster it made) both enter here. The
        owner also holds the buckets clusterd makes for the task as well as the cluster
        does: they outlive the cluster until the owner releases them."""
        name, task = launch.name, launch.task
        # Before the lock and before any node is made: a copy that must not happen fails
        # the launch at once.
        copy_warnings = await self._jobs.check_copies(task, strict=launch.strict)
        unmountable: StorageError | None = None
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "launch",
                                    on_blocked=request.blocked) as grant:
            # `down` calls it off in whatever phase it is (see LaunchSteps._provision_new
            # for what a new cluster's launch removes then; an existing one is down's).
            with grant.interruptible(f"launch {name} again once that finishes"):
                refuse_other_owner(self._store.get(name), launch.owner)
                # Buckets first: a missing one fails the launch before any node is made.
                regions = await self._steps.prepare_buckets(request, name, task, launch.owner)
                created = self._store.get(name) is None
                warn = Warnings(request, self._store, name)
                await warn(copy_warnings)
                record, resources = await self._steps.launch(request, launch, warn)
                if launch.autostop is not None:
                    record = await self._steps.apply_autostop(record, launch.autostop,
                                                              request.id)
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

    async def start(self, request: RunningRequest, name: str) -> dict[str, Any]:
        require_cluster(self._store, name)
        async with self._locks.hold(name, LockMode.EXCLUSIVE, request.id, "start",
                                    on_blocked=request.blocked) as grant:
            with grant.interruptible(f"start {name} again once that finishes"):
                record = require_cluster(self._store, name)
                record = await self._steps.bring_up(request, None, record)
        return {"cluster": name, "status": str(record.status)}

    async def stop(self, request: RunningRequest, name: str, *, reason: str | None = None,
                   precheck: Precheck | None = None) -> dict[str, Any]:
        """Stop the cluster (its runtime, then its nodes); see Teardown.stop."""
        return await self._teardown.stop(request, name, reason=reason, precheck=precheck)

    async def down(self, request: RunningRequest, name: str, purge: bool, *,
                   reason: str | None = None, precheck: Precheck | None = None,
                   call_off: bool = False, discard: bool = False) -> dict[str, Any]:
        """Tear the cluster down; see Teardown.down."""
        return await self._teardown.down(request, name, purge, reason=reason,
                                         precheck=precheck, call_off=call_off,
                                         discard=discard)

    async def apply_autostop(self, record: ClusterRecord, setting: Autostop | None,
                             request_id: int | None = None, *, announce: bool = True
                             ) -> ClusterRecord:
        """Set (None: cancel) autostop; the caller holds the lock (LaunchSteps.apply_autostop)."""
        return await self._steps.apply_autostop(record, setting, request_id,
                                                announce=announce)

    async def prepare_buckets(self, request: RunningRequest, name: str,
                              task: TaskSpec, owner: str | None = None
                              ) -> dict[str, str] | None:
        return await self._steps.prepare_buckets(request, name, task, owner)

    async def release_buckets(self, request: RunningRequest, name: str) -> dict[str, Any]:
        return await self._teardown.release_buckets(request, name)

    async def cluster_info(self, record: ClusterRecord) -> ClusterInfo:
        return await self._jobs.cluster_info(record)

    async def ssh_access(self, name: str, node: int) -> dict[str, Any]:
        """How to reach node `node` of the UP cluster `name` with OpenSSH (see ssh_access)."""
        record = require_up(require_cluster(self._store, name))
        return ssh_access(record, await self.cluster_info(record), node, self._ssh_config)

    def provision_stats(self) -> dict[str, float]:
        return self._provisioner.stats()

    def forget_config(self, name: str) -> None:
        """The cluster is gone: so is its `ssh CLUSTER` configuration."""
        self._ssh_config.remove(name)

    async def forget_nodes(self, record: ClusterRecord) -> None:
        """Drop the SSH connections of a cluster found gone (best effort)."""
        forget = self._teardown.forget_nodes
        if forget is None or not record.handle.provider:
            return
        try:
            info = await self.cluster_info(record)
        except ProtocolError:
            return
        await forget([n.ssh for n in info.nodes if n.ssh is not None])
