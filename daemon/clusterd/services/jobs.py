"""Jobs on UP clusters: submit (exec), queue, logs, cancel, all through the cluster's agent."""

from __future__ import annotations

import dataclasses
import functools
import getpass
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from clusterctl.protocol import ErrorCode, JobStatus, ProtocolError, exit_code_for_job
from clusterd import log
from clusterd.concurrency import first_error, on_each
from clusterd.faults import fault_point
from clusterd.keptlogs.keeper import LogKeeper, kept_cluster
from clusterd.keptlogs.serve import stream_kept
from clusterd.keptlogs.store import KeptLogStore
from clusterd.locks import ClusterLocks, LockMode
from clusterd.node_shared import containers
from clusterd.node_shared.node_commands import ContainerRuntimeRequest, GitCheckoutRequest
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.providers.registry import ProviderRegistry
from clusterd.requests import RunningRequest
from clusterd.rsync import Progress, ProgressHook
from clusterd.runtime import node_helper
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_types import Job, JobSpec, NodeResources
from clusterd.runtime.manager import RunnerFactory
from clusterd.services.common import (
    announce_warnings,
    fit_to_cluster,
    head_unreachable,
    provider_handle,
    require_cluster,
    require_head,
    require_up,
)
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.storage.s3 import StorageError
from clusterd.storage.service import StorageService
from clusterd.tasks.file_sync import CopyGuard, human_bytes
from clusterd.tasks.spec import GitWorkdir, TaskSpec

logger = log.get("clusterd.jobs")

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
# How long a following log stream keeps trying to get back to an agent that went away.
RESUME_WINDOW_S = 60.0


def job_to_wire(job: Job) -> dict[str, Any]:
    return {
        "job_id": job.job_id,
        "name": job.name,
        "user": job.user,
        "status": str(job.status),
        "submitted_at": job.submitted_at,
        "started_at": job.started_at,
        "ended_at": job.ended_at,
        "resources": job.resources_display,
        "num_nodes": job.num_nodes,
        "log_dir": job.log_dir,
        "failure_reason": job.failure_reason,
        "exit_codes": list(job.exit_codes),
        "task_id": job.task_id,
    }


class FinishedJobs:
    """Finished jobs' wire maps, made once: a finished job never changes again, and a queue
    of thousands of jobs otherwise converted every one on each call. Keyed by task id (it
    names the cluster and the submission time: a job id alone comes again on a new cluster
    of the same name), and made again for a job other than the one it was made from (the
    agent client hands the same object back for a finished job: mostly an identity check)."""

    LIMIT = 50_000

    def __init__(self) -> None:
        self._maps: dict[str, tuple[Job, dict[str, Any]]] = {}

    def wire(self, job: Job) -> dict[str, Any]:
        if not job.status.is_terminal or not job.task_id:
            return job_to_wire(job)
        found = self._maps.get(job.task_id)
        if found is not None and (found[0] is job or found[0] == job):
            return found[1]
        if len(self._maps) >= self.LIMIT:
            self._maps.clear()
        made = job_to_wire(job)
        self._maps[job.task_id] = (job, made)
        return made


class JobService:
    def __init__(
        self,
        store: ClusterStore,
        locks: ClusterLocks,
        providers: ProviderRegistry,
        access: AgentAccess,
        runner_for: RunnerFactory,
        copy_guard: CopyGuard,
        storage: StorageService | None = None,
        keeper: LogKeeper | None = None,
    ) -> None:
        self._keeper = keeper
        self._store = store
        self._locks = locks
        self._providers = providers
        self._access = access
        self._runner_for = runner_for
        self._copy_guard = copy_guard
        self._storage = storage
        self._finished = FinishedJobs()

    async def cluster_info(self, record: ClusterRecord) -> ClusterInfo:
        provider = self._providers.get(record.provider)
        return await provider.cluster_info(record.cloud_name, provider_handle(record, provider))

    # -- submission -----------------------------------------------------------------------

    async def check_copies(self, task: TaskSpec, *, strict: bool) -> list[str]:
        """Before anything is made or copied: refuse a workdir or file mount that would send
        clusterd's own directories (or, under `strict`, one above the size threshold);
        return the warnings for large ones (see tasks/file_sync.py)."""
        return await self._copy_guard.check(task, strict=strict)

    async def exec(self, request: RunningRequest, name: str, task: TaskSpec, *,
                   strict: bool = False, run_setup: bool = False, task_id: str = ""
                   ) -> dict[str, Any]:
        """Run the task on the UP cluster, once it passes the check a launch onto that
        cluster makes (fit_to_cluster): refused if the cluster cannot give what it asks for,
        warned of (or, with `strict`, refused) for fields without effect there."""
        record = require_up(require_cluster(self._store, name))
        copy_warnings = await self.check_copies(task, strict=strict)
        async with self._locks.hold(name, LockMode.SHARED, request.id, "exec",
                                    on_blocked=request.blocked):
            record = require_up(require_cluster(self._store, name))
            resources, warnings = fit_to_cluster(
                record, task, self._providers.honoured_fields(record.provider), strict=strict)
            await announce_warnings(request, self._store, name,
                                    [*task.warnings, *warnings, *copy_warnings])
            task = dataclasses.replace(task, resources=resources, resource_choices=())
            return await self.submit(request, record, task, run_setup=run_setup,
                                     task_id=task_id)

    async def submit(
        self, request: RunningRequest, record: ClusterRecord, task: TaskSpec, *, run_setup: bool,
        task_id: str = "", bucket_regions: dict[str, str] | None = None,
    ) -> dict[str, Any]:
        """Copy the task's files to the nodes and queue it. The caller holds the lock.
        `task_id`: the job's SKYPILOT_TASK_ID (empty: the agent makes one).
        `bucket_regions`: the task's buckets, already made ready by a launch (else here)."""
        run = task.run
        setup = task.setup if run_setup else None
        if not run and not setup:
            return {"cluster": record.name, "job_id": None}
        info = await self.cluster_info(record)
        if task.num_nodes > len(info.nodes):
            raise ProtocolError(
                ErrorCode.RESOURCES_UNAVAILABLE,
                f"the task asks for {task.num_nodes} nodes; cluster {record.name} has "
                f"{len(info.nodes)}",
                "launch a cluster with more nodes under another name",
            )
        image = containers.image_of(task.resources.image_id)
        if image:
            await self._require_container_runtime(info, image)
        await self._sync_files(request, info, task)
        await self._mount_buckets(request, record, info, task, bucket_regions)
        resources = task.resources
        spec = JobSpec(
            name=task.name or "",
            setup=setup or "",
            run=run or ":",
            envs=task.envs,
            secrets=task.secrets,
            num_nodes=task.num_nodes,
            resources=NodeResources(
                cpus=resources.job_cpus,
                gpus=resources.accelerator_count,
                memory_gb=resources.memory_gb or 0,
                accelerator=resources.accelerator or "",
            ),
            workdir=info.head.workdir,
            user=getpass.getuser(),
            cluster_name=record.name,
            resources_display=resources.display(task.num_nodes),
            container_image=image or "",
            task_id=task_id,
            **_where(record, self._providers.get(record.provider).skypilot_cloud),
        )
        agent = await self._access.client(record)
        await fault_point("exec.during_submit")
        reply = await agent.add_job(spec)
        if self._keeper is not None:
            self._keeper.wake(record.name)
        request.emit("job", {"job_id": reply.job_id, "cluster": record.name})
        logger.info("job submitted", job_id=reply.job_id)
        return {"cluster": record.name, "job_id": reply.job_id, "task_id": reply.task_id}

    async def _require_container_runtime(self, info: ClusterInfo, image: str) -> None:
        """docker:IMAGE runs only where a container runtime answers: on every node."""
        async def check(node: NodeInfo) -> None:
            found = await node_helper.call(self._runner_for(node), ContainerRuntimeRequest(),
                                           timeout_s=60)
            if not found.runtime:
                raise ProtocolError(
                    ErrorCode.INVALID_TASK,
                    f"resources.image_id: docker:{image} runs the job in a container, and "
                    f"{node.node_id} has no container runtime that answers: {found.why}",
                    "install docker or podman on the nodes, or drop image_id to run on the "
                    "node itself")

        await on_each(info.nodes, check)

    async def _sync_files(self, request: RunningRequest, info: ClusterInfo,
                          task: TaskSpec) -> None:
        if task.workdir is None and not task.file_mounts:
            return
        if isinstance(task.workdir, GitWorkdir):
            ref = f" at {task.workdir.ref}" if task.workdir.ref else ""
            await request.progress(f"checking out {task.workdir.url}{ref}", "sync")
        elif task.workdir:
            await request.progress(f"syncing workdir {task.workdir}", "sync")
        if task.file_mounts:
            await request.progress(f"copying {len(task.file_mounts)} file mount(s)", "sync")
        # The loader keeps GIT_TOKEN among the secrets wherever the task wrote it.
        token = task.secrets.get("GIT_TOKEN")
        many = len(info.nodes) > 1

        def reporter(what: str, node: NodeInfo) -> ProgressHook:
            where = f" to {node.node_id}" if many else ""

            async def report(progress: Progress) -> None:
                await request.progress(
                    f"syncing {what}{where}: {human_bytes(progress.bytes_sent)} in "
                    f"{progress.files_sent} files sent ({progress.rate})", "sync")
            return report

        with first_error():
            async with anyio.create_task_group() as group:
                for node in info.nodes:
                    runner = self._runner_for(node)
                    if isinstance(task.workdir, GitWorkdir):
                        group.start_soon(node_helper.call, runner, GitCheckoutRequest(
                            url=task.workdir.url, ref=task.workdir.ref, dest=node.workdir,
                            token=token))
                    elif task.workdir:
                        group.start_soon(functools.partial(
                            runner.sync_dir, task.workdir, node.workdir,
                            on_progress=reporter("workdir", node)))
                    for remote, local in task.file_mounts.items():
                        target = remote if remote.startswith(("/", "~")) else f"~/{remote}"
                        group.start_soon(functools.partial(
                            runner.put_path, local, target,
                            on_progress=reporter(f"file mount {remote}", node)))

    async def _mount_buckets(self, request: RunningRequest, record: ClusterRecord,
                             info: ClusterInfo, task: TaskSpec,
                             regions: dict[str, str] | None) -> None:
        if not task.bucket_mounts:
            return
        if self._storage is None:
            raise ProtocolError(ErrorCode.INVALID_TASK, "bucket mounts are not offered here")

        async def progress(message: str) -> None:
            await request.progress(message, "storage")

        if regions is None:
            regions = await self._storage.prepare(record.name, task.bucket_mounts, progress)
        await self._storage.apply(info, self._grant(record), task.bucket_mounts, regions,
                                  progress)
        await self._storage.remember(record.name, task.bucket_mounts)

    async def restore_buckets(self, request: RunningRequest, record: ClusterRecord,
                              info: ClusterInfo) -> None:
        """The cluster's nodes (some perhaps made again) have its tasks' bucket mounts."""
        if self._storage is None:
            return

        async def progress(message: str) -> None:
            await request.progress(message, "storage")

        await self._storage.restore(record.name, info, self._grant(record), progress)

    def _grant(self, record: ClusterRecord) -> Callable[[tuple[str, ...]], Awaitable[bool]]:
        """Access to buckets for the cluster's nodes by the provider's own means."""
        provider = self._providers.get(record.provider)
        handle = provider_handle(record, provider)

        async def grant(buckets: tuple[str, ...]) -> bool:
            try:
                return await provider.grant_buckets(record.cloud_name, handle, buckets)
            except ProtocolError as exc:
                raise StorageError(exc.code, exc.message, exc.hint) from None

        return grant

    # -- queue, logs, cancel --------------------------------------------------------------

    async def queue(self, name: str, skip_finished: bool) -> dict[str, Any]:
        record = require_head(require_cluster(self._store, name))
        try:
            agent = await self._access.client(record)
            jobs = await agent.queue(skip_finished)
        except ProtocolError as exc:
            raise head_unreachable(record, exc) from None
        return {"cluster": name, "jobs": [self._finished.wire(j) for j in jobs]}

    async def cancel(self, name: str, job_ids: list[int], cancel_all: bool) -> dict[str, Any]:
        if not job_ids and not cancel_all:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, "name the jobs to cancel",
                                "give job ids, or --all")
        record = require_head(require_cluster(self._store, name))
        try:
            agent = await self._access.client(record)
            known = {j.job_id: j for j in await agent.jobs(job_ids)} if job_ids else {}
        except ProtocolError as exc:
            raise head_unreachable(record, exc) from None
        missing = [i for i in job_ids if i not in known]
        if missing:
            raise ProtocolError(ErrorCode.JOB_NOT_FOUND,
                                f"cluster {name} has no job {', '.join(map(str, missing))}",
                                f"see `clusterctl queue {name}`")
        cancelled = await agent.cancel(job_ids, cancel_all)
        already = [i for i in job_ids if i not in cancelled]
        return {"cluster": name, "cancelled": cancelled, "already_finished": already}

    async def _kept_copies(self, name: str) -> tuple[KeptLogStore, Path] | None:
        """Where the kept copies of the cluster's jobs' logs are, if its head cannot answer
        for them (it is stopped, or gone) and copies were kept; else None."""
        if self._keeper is None:
            return None
        record = self._store.get(name)
        if record is not None:
            try:
                require_head(record)
                return None
            except ProtocolError:
                pass
        kept = self._keeper.kept
        if record is not None:
            current = kept.root / kept_cluster(record).key
            if not await anyio.to_thread.run_sync(current.is_dir):
                return None
            return kept, current
        directory = await anyio.to_thread.run_sync(kept.latest, name)
        return None if directory is None else (kept, directory)

    def _still_up(self, name: str, job_id: int) -> ClusterRecord:
        record = self._store.get(name)
        if record is None:
            raise ProtocolError(
                ErrorCode.CLUSTER_NOT_FOUND,
                f"cluster {name} was torn down while its job {job_id} was followed",
                f"see `clusterctl events {name}`",
            )
        return require_head(record)

    async def stream_logs(
        self,
        name: str,
        job_id: int | None,
        *,
        follow: bool,
        tail: int,
        offset: int | None,
        emit: Emit,
        on_break: Callable[[], None] | None = None,
        kept: bool = False,
    ) -> dict[str, Any]:
        """Relay a job's log as `log` events; the result carries its status and exit code.

        If the agent goes away mid-stream (a restarted agent, a dropped tunnel), the stream
        resumes from the last byte offset it relayed, so no line is lost or repeated.
        `on_break` is called (it must not block) once each time the stream breaks, before
        the first try to resume it: a lost connection is often the first sign of a lost node.
        With `kept` (a user's `logs`), a cluster that is stopped or gone answers from the
        kept copy of the job's log, if there is one; without it (the managed-jobs controller,
        which must learn that a cluster is lost), as ever: CLUSTER_NOT_FOUND, CLUSTER_NOT_UP.
        """
        if tail < 0:  # the handler checks the range; this is for other callers
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, "tail must be ≥ 0")
        copies = await self._kept_copies(name) if kept else None
        if copies is not None:
            return await stream_kept(copies[0], name, copies[1], job_id, tail, offset, emit)
        record = require_head(require_cluster(self._store, name))
        position = offset or 0
        lines = tail if offset is None else 0
        current = job_id or 0
        deadline: float | None = None
        while True:
            try:
                agent = await self._access.client(record)
                async for message in agent.tail(current, follow=follow, tail_lines=lines,
                                                offset=position):
                    deadline = None
                    current = message.job_id
                    if message.final:
                        status = message.status
                        assert status is not None  # the agent client sets it on a final one
                        reason = message.failure_reason
                        if not reason and status.is_terminal and \
                                status != JobStatus.SUCCEEDED:  # an agent older than the field
                            jobs = await agent.jobs([current])
                            reason = jobs[0].failure_reason if jobs else ""
                        return {"cluster": name, "job_id": current, "status": str(status),
                                "failure_reason": reason, "offset": position,
                                "exit_code": int(exit_code_for_job(status))}
                    lines = 0  # resumption goes by offset from here on
                    position = message.offset
                    await emit("log", {"data": message.data, "offset": message.offset,
                                       "job_id": current})
                    await fault_point("exec.streaming")
                raise ProtocolError(ErrorCode.AGENT_UNREACHABLE,
                                    "log stream ended without a final status")
            except ProtocolError as exc:
                if exc.code == ErrorCode.JOB_NOT_FOUND:
                    raise ProtocolError(
                        ErrorCode.JOB_NOT_FOUND,
                        f"cluster {name} has no job {job_id}" if job_id
                        else f"cluster {name} has no jobs yet",
                        f"see `clusterctl queue {name}`",
                    ) from None
                if exc.code != ErrorCode.AGENT_UNREACHABLE or not follow:
                    raise head_unreachable(record, exc) from None
                now = anyio.current_time()
                if deadline is None and on_break is not None:
                    on_break()
                deadline = deadline or now + RESUME_WINDOW_S
                if now > deadline:
                    raise head_unreachable(record, exc) from None
                logger.info("log stream interrupted; resuming", offset=position)
                await self._access.reset(name)
                await anyio.sleep(0.5)
                record = self._still_up(name, current)


def _where(record: ClusterRecord, cloud: str) -> dict[str, str]:
    """SKYPILOT_CLUSTER_INFO's place: `cloud` as SkyPilot names the provider."""
    placed = record.launched_resources
    return {
        "cloud": cloud,
        "region": (placed and placed.region) or "",
        "zone": (placed and placed.zone) or "",
    }
