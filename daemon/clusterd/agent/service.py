"""gRPC servicers: translate between protobuf messages and the scheduler, logs and autostop.

Thin on purpose: each method validates, makes one call and converts the answer.
"""

from __future__ import annotations

import functools
import inspect
import os
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

import grpc
import ray
import structlog

from clusterctl._version import __version__
from clusterd.agent.autostop import AutostopState, ContactClock
from clusterd.agent.in_memory import split
from clusterd.agent.jobs_db import Job, JobStore
from clusterd.agent.logs import LogHub
from clusterd.agent.scheduler import Infeasible, Scheduler
from clusterd.agent.usage import UsageRings
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.v1 import agent_pb2_grpc as pb_grpc
from clusterd.agent.wire import status_to_pb
from clusterd.node_shared import containers
from clusterd.node_shared.auth import NONCE_BYTES, NonceBook, agent_proof, new_nonce
from clusterd.node_shared.wire import (
    AGENT_PROTOCOL,
    REQUEST_ID_METADATA,
    VERSION_METADATA,
    VERSION_MISMATCH_PREFIX,
)


def job_to_pb(job: Job) -> pb.Job:
    return pb.Job(
        job_id=job.job_id,
        name=job.name,
        user=job.user,
        status=status_to_pb(job.status),
        submitted_at=job.submitted_at,
        started_at=job.started_at or 0,
        ended_at=job.ended_at or 0,
        resources_display=job.resources_display,
        num_nodes=job.num_nodes,
        log_dir=job.log_dir,
        failure_reason=job.failure_reason,
        exit_codes=job.exit_codes,
        task_id=job.task_id,
    )


def spec_from_pb(spec: pb.JobSpec) -> dict[str, Any]:
    """The job as given, but the secrets (see in_memory.split for what is stored)."""
    return {
        "name": spec.name,
        "setup": spec.setup,
        "run": spec.run,
        "envs": dict(spec.envs),
        "num_nodes": spec.num_nodes or 1,
        "resources": {
            "cpus": spec.resources.cpus,
            "gpus": spec.resources.gpus,
            "memory_gb": spec.resources.memory_gb,
            "accelerator": spec.resources.accelerator,
        },
        "workdir": spec.workdir,
        "user": spec.user,
        "cluster_name": spec.cluster_name,
        "resources_display": spec.resources_display,
        "container_image": spec.container_image,
        "cloud": spec.cloud,
        "region": spec.region,
        "zone": spec.zone,
        "task_id": spec.task_id,
    }


async def _admit(servicer: Any, context: Any) -> None:
    """Note the daemon's visit, bind its request id for log lines, and refuse a daemon of
    another version."""
    contact = getattr(servicer, "contact", None)
    if contact is not None:
        contact.touch()
    metadata = dict(context.invocation_metadata() or ())
    if REQUEST_ID_METADATA in metadata:
        structlog.contextvars.bind_contextvars(request_id=metadata[REQUEST_ID_METADATA])
    caller = metadata.get(VERSION_METADATA)
    if caller is not None and caller != __version__:
        await context.abort(
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{VERSION_MISMATCH_PREFIX} this agent runs clusterd {__version__}, the daemon "
            f"{caller}",
        )


def traced(method: Callable[..., Any]) -> Callable[..., Any]:
    """Admit the call (see _admit), then serve it with its request id bound."""
    if inspect.isasyncgenfunction(method):
        @functools.wraps(method)
        async def stream(self: Any, request: Any, context: Any) -> AsyncIterator[Any]:
            await _admit(self, context)
            async for item in method(self, request, context):
                yield item
        return stream

    @functools.wraps(method)
    async def unary(self: Any, request: Any, context: Any) -> Any:
        await _admit(self, context)
        return await method(self, request, context)
    return unary


class JobsService(pb_grpc.JobsServiceServicer):
    def __init__(self, store: JobStore, hub: LogHub, scheduler: Scheduler,
                 contact: ContactClock) -> None:
        self.contact = contact
        self._store = store
        self._hub = hub
        self._scheduler = scheduler
        # A finished job's message, made once: it never changes again, and a queue of
        # thousands of jobs otherwise built every one anew on each call (py-spy: 3/4 of the
        # agent's time in a queue).
        self._finished: dict[int, pb.Job] = {}

    def _message(self, job: Job) -> pb.Job:
        if job.active:
            return job_to_pb(job)
        message = self._finished.get(job.job_id)
        if message is None:
            if len(self._finished) > 2 * len(self._store) + 1000:  # pruned jobs' messages
                self._finished = {i: m for i, m in self._finished.items()
                                  if self._store.get(i) is not None}
            message = self._finished[job.job_id] = job_to_pb(job)
        return message

    @traced
    async def AddJob(self, request: pb.AddJobRequest, context: Any) -> pb.AddJobResponse:
        spec = request.spec
        if not spec.run.strip():
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "the job has nothing to run")
        if spec.container_image:
            try:  # the daemon's task loader checked it; an image must never pass for an option
                containers.check_image(spec.container_image)
            except containers.BadImage as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"container_image: {exc}")
        try:
            job = await self._scheduler.submit(*split(spec_from_pb(spec), dict(spec.secrets)))
        except Infeasible as exc:
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
        return pb.AddJobResponse(job_id=job.job_id, log_dir=job.log_dir, task_id=job.task_id)

    @traced
    async def GetJobQueue(
        self, request: pb.GetJobQueueRequest, context: Any
    ) -> pb.GetJobQueueResponse:
        jobs = self._store.all()
        if request.skip_finished:
            jobs = [j for j in jobs if j.active]
        return pb.GetJobQueueResponse(jobs=[self._message(j) for j in reversed(jobs)])

    @traced
    async def GetJobStatus(
        self, request: pb.GetJobStatusRequest, context: Any
    ) -> pb.GetJobStatusResponse:
        if request.job_ids:
            jobs = [j for i in request.job_ids if (j := self._store.get(i)) is not None]
        else:
            latest = self._store.latest()
            jobs = [latest] if latest else []
        return pb.GetJobStatusResponse(jobs=[self._message(j) for j in jobs])

    @traced
    async def CancelJobs(
        self, request: pb.CancelJobsRequest, context: Any
    ) -> pb.CancelJobsResponse:
        cancelled = await self._scheduler.cancel(list(request.job_ids), request.all)
        return pb.CancelJobsResponse(cancelled_job_ids=cancelled)

    @traced
    async def TailLogs(
        self, request: pb.TailLogsRequest, context: Any
    ) -> AsyncIterator[pb.TailLogsResponse]:
        job = self._store.get(request.job_id) if request.job_id else self._store.latest()
        if job is None:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"job {request.job_id} not found")
            return
        async for chunk, offset in self._hub.tail(
            job.job_id,
            follow=request.follow,
            tail_lines=request.tail_lines,
            start_offset=request.start_offset,
            job_done=lambda: not job.active,
        ):
            yield pb.TailLogsResponse(data=chunk, offset=offset, job_id=job.job_id)
        yield pb.TailLogsResponse(final=True, status=status_to_pb(job.status), job_id=job.job_id,
                                  failure_reason=job.failure_reason or "")

    @traced
    async def GetLogDirs(
        self, request: pb.GetLogDirsRequest, context: Any
    ) -> pb.GetLogDirsResponse:
        jobs = [self._store.get(i) for i in request.job_ids] if request.job_ids else [
            self._store.latest()
        ]
        return pb.GetLogDirsResponse(log_dirs={j.job_id: j.log_dir for j in jobs if j})

    @traced
    async def FailInProgressJobs(
        self, request: pb.FailInProgressJobsRequest, context: Any
    ) -> pb.FailInProgressJobsResponse:
        failed = await self._scheduler.fail_in_progress(request.reason or "failed by request")
        return pb.FailInProgressJobsResponse(failed_job_ids=failed)


class AutostopService(pb_grpc.AutostopServiceServicer):
    def __init__(self, state: AutostopState, contact: ContactClock) -> None:
        self._state = state
        self.contact = contact

    @traced
    async def SetAutostop(
        self, request: pb.SetAutostopRequest, context: Any
    ) -> pb.SetAutostopResponse:
        await self._state.set(request.idle_minutes, request.down, request.wait_for)
        return pb.SetAutostopResponse()

    @traced
    async def IsAutostopping(
        self, request: pb.IsAutostoppingRequest, context: Any
    ) -> pb.IsAutostoppingResponse:
        return pb.IsAutostoppingResponse(is_autostopping=self._state.autostopping)

    @traced
    async def GetIdleInfo(
        self, request: pb.GetIdleInfoRequest, context: Any
    ) -> pb.GetIdleInfoResponse:
        return await self._state.current_idle_info()


class HealthService(pb_grpc.HealthServiceServicer):
    def __init__(self, scheduler: Scheduler, contact: ContactClock, token: str,
                 nonces: NonceBook) -> None:
        self.contact = contact
        self._scheduler = scheduler
        self._token = token
        self._nonces = nonces
        self._started_at = time.time()

    async def Handshake(self, request: pb.HandshakeRequest, context: Any
                        ) -> pb.HandshakeResponse:
        """Prove we hold the cluster's token (see auth.py); needs no credential."""
        if len(request.client_nonce) != NONCE_BYTES:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT,
                                f"client_nonce must be {NONCE_BYTES} bytes")
        server_nonce = new_nonce()
        return pb.HandshakeResponse(
            server_nonce=server_nonce,
            proof=agent_proof(self._token, request.client_nonce, server_nonce),
            version=__version__,
            protocol=AGENT_PROTOCOL,
        )

    async def IssueNonces(self, request: pb.IssueNoncesRequest, context: Any
                          ) -> pb.IssueNoncesResponse:
        """Nonces for the daemon's next credentials (see auth.py); needs no credential."""
        return pb.IssueNoncesResponse(nonces=self._nonces.issue(request.count),
                                      ttl_s=self._nonces.ttl_s)

    async def GetHealth(self, request: pb.GetHealthRequest, context: Any) -> pb.GetHealthResponse:
        self.contact.touch()
        connected = ray.is_initialized()
        alive = await self._scheduler.nodes() if connected else []
        return pb.GetHealthResponse(
            version=__version__,
            protocol=AGENT_PROTOCOL,
            ray_connected=connected,
            ray_nodes_alive=len(alive),
            ray_node_ips=sorted(n.ip for n in alive),
            started_at=self._started_at,
            pid=os.getpid(),
        )


class UsageService(pb_grpc.UsageServiceServicer):
    def __init__(self, rings: UsageRings, contact: ContactClock) -> None:
        self._rings = rings
        self.contact = contact

    @traced
    async def GetNodeUsage(self, request: pb.GetNodeUsageRequest, context: Any
                           ) -> pb.GetNodeUsageResponse:
        return pb.GetNodeUsageResponse(interval_s=self._rings.interval_s, nodes=[
            pb.NodeUsage(node_id=node_id, ip=ip, head=head, samples=[
                pb.UsageSample(
                    ts=s.ts, cpu_percent=-1.0 if s.cpu_percent is None else s.cpu_percent,
                    memory_used_bytes=s.memory_used_bytes,
                    memory_total_bytes=s.memory_total_bytes,
                    gpus=[pb.GpuUse(util_percent=g.util_percent,
                                    memory_used_bytes=g.memory_used_bytes,
                                    memory_total_bytes=g.memory_total_bytes) for g in s.gpus])
                for s in samples])
            for node_id, ip, head, samples in self._rings.nodes(request.since)])
