"""The daemon's client of a cluster's agent (gRPC over a local Unix socket: the agent's own
for `local` clusters, an SSH tunnel's otherwise).

A connection starts with the handshake (node_shared/auth.py): the agent proves it holds the
cluster's token, or nothing else is sent to it; then every call carries a credential of its
own, good once, over a nonce the agent issued (fetched a batch at a time, used before they
expire). gRPC errors are translated here, at the boundary, into ProtocolErrors with stable
codes. Version skew is checked once, at the handshake.

The only module of the daemon that speaks protobuf: callers pass and get the typed values of
agent_types.py, converted here.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import hmac
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any, TypeVar

import anyio
import grpc
import structlog

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.v1 import agent_pb2_grpc as pb_grpc
from clusterd.agent.wire import status_from_pb, status_to_pb
from clusterd.node_shared.auth import (
    AUTH_METADATA,
    NONCE_BYTES,
    daemon_credential,
    new_nonce,
    proof_is_valid,
)
from clusterd.node_shared.wire import (
    AGENT_PROTOCOL,
    REQUEST_ID_METADATA,
    VERSION_METADATA,
    VERSION_MISMATCH_PREFIX,
)
from clusterd.runtime.agent_types import (
    AutostopSetting,
    GpuUse,
    Health,
    IdleInfo,
    Job,
    JobSpec,
    LogChunk,
    NodeUsage,
    SubmittedJob,
    UsageSample,
    WaitFor,
)

T = TypeVar("T")
CALL_TIMEOUT_S = 30.0
HANDSHAKE_TIMEOUT_S = 5.0
# The most the daemon takes in one reply (a long queue listing): the agent's own bound, with room.
MAX_REPLY_BYTES = 64 * 1024 * 1024
# Nonces asked for at a time: a few calls' worth, so most calls cost no extra round trip.
NONCE_BATCH = 16
# A nonce is used within this share of the lifetime the agent gave it (counted from when we
# asked): the rest is for the call carrying it to reach the agent.
NONCE_USE_WITHIN = 0.75
MAX_NONCE_TTL_S = 3600.0


WAIT_FOR_TO_PB: dict[WaitFor, pb.WaitFor] = {
    "jobs_and_ssh": pb.WAIT_FOR_JOBS_AND_SSH,
    "jobs": pb.WAIT_FOR_JOBS,
    "none": pb.WAIT_FOR_NONE,
}


def job_spec_to_pb(spec: JobSpec) -> pb.JobSpec:
    resources = spec.resources
    return pb.JobSpec(
        name=spec.name, setup=spec.setup, run=spec.run, envs=spec.envs, secrets=spec.secrets,
        num_nodes=spec.num_nodes,
        resources=pb.NodeResources(cpus=resources.cpus, gpus=resources.gpus,
                                   memory_gb=resources.memory_gb,
                                   accelerator=resources.accelerator),
        workdir=spec.workdir, user=spec.user, cluster_name=spec.cluster_name,
        resources_display=spec.resources_display, container_image=spec.container_image,
        cloud=spec.cloud, region=spec.region, zone=spec.zone, task_id=spec.task_id,
    )


def job_from_pb(job: pb.Job) -> Job:
    return Job(
        job_id=job.job_id, name=job.name, user=job.user, status=status_from_pb(job.status),
        submitted_at=job.submitted_at, started_at=job.started_at or None,
        ended_at=job.ended_at or None, resources_display=job.resources_display,
        num_nodes=job.num_nodes, log_dir=job.log_dir, failure_reason=job.failure_reason,
        exit_codes=tuple(job.exit_codes), task_id=job.task_id,
    )


class FinishedJobCache:
    """Finished jobs, converted once: a finished job never changes, and a queue of thousands
    of jobs was otherwise converted whole (some µs a job) on every listing. Keyed by task id
    (it names the cluster and the submission time: a job id alone comes again on a new
    cluster of the same name), and checked against the message's status and end."""

    LIMIT = 50_000

    def __init__(self) -> None:
        self._jobs: dict[str, Job] = {}

    def convert(self, messages: Iterable[pb.Job]) -> list[Job]:
        jobs = []
        for message in messages:
            job = self._jobs.get(message.task_id) if message.task_id else None
            if job is None or job.ended_at != (message.ended_at or None) or \
                    status_to_pb(job.status) != message.status:
                job = job_from_pb(message)
                if job.status.is_terminal and job.task_id:
                    if len(self._jobs) >= self.LIMIT:
                        self._jobs.clear()
                    self._jobs[job.task_id] = job
            jobs.append(job)
        return jobs


def log_chunk_from_pb(message: pb.TailLogsResponse) -> LogChunk:
    return LogChunk(
        job_id=message.job_id, data=message.data, offset=message.offset, final=message.final,
        status=status_from_pb(message.status) if message.final else None,
        failure_reason=message.failure_reason,
    )


def health_from_pb(health: pb.GetHealthResponse) -> Health:
    return Health(
        version=health.version, protocol=health.protocol, ray_connected=health.ray_connected,
        ray_nodes_alive=health.ray_nodes_alive, started_at=health.started_at, pid=health.pid,
        ray_node_ips=tuple(health.ray_node_ips),
    )


def node_usage_from_pb(node: pb.NodeUsage) -> NodeUsage:
    return NodeUsage(node_id=node.node_id, ip=node.ip, head=node.head, samples=tuple(
        UsageSample(ts=s.ts, cpu_percent=s.cpu_percent if s.cpu_percent >= 0 else None,
                    memory_used_bytes=s.memory_used_bytes,
                    memory_total_bytes=s.memory_total_bytes,
                    gpus=tuple(GpuUse(g.util_percent, g.memory_used_bytes,
                                      g.memory_total_bytes) for g in s.gpus))
        for s in node.samples))


def request_metadata() -> tuple[tuple[str, str], ...]:
    """Our version (the agent refuses a daemon it does not match) and the daemon request
    being served (the agent's log lines carry its id too)."""
    request_id = structlog.contextvars.get_contextvars().get("request_id")
    metadata = [(VERSION_METADATA, __version__)]
    if request_id is not None:
        metadata.append((REQUEST_ID_METADATA, str(request_id)))
    return tuple(metadata)


def version_mismatch(cluster: str, detail: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.AGENT_VERSION_MISMATCH,
        f"the agent of cluster {cluster} is of another version: {detail}",
        f"re-launch to upgrade it: clusterctl launch -c {cluster}",
    )


@contextlib.asynccontextmanager
async def closed_under_the_call(cluster: str) -> AsyncIterator[None]:
    """A call whose channel another task closed (a reset after a failed health check, a
    client replaced) ends in asyncio's CancelledError, though nobody cancelled the task
    making it. Let through, that ends a task group silently, as if the group itself had been
    cancelled (a log stream followed in one just stopped, with no status and no error). It
    is the agent's connection gone: AGENT_UNREACHABLE, which callers retry.

    A cancellation of the task itself (a timeout around the call) must end as that
    cancellation. But grpc, having cancelled its call, raises a CancelledError of its own,
    without the cancel scope's message that anyio goes by: a `fail_after` would not know it
    as its own and let it through, as a cancellation of everything around it (a managed job's
    watch ended so, with neither status nor error). One checkpoint takes the scope's own
    cancellation, which anyio delivers again until the task leaves the scope."""
    try:
        yield
    except asyncio.CancelledError:
        task = asyncio.current_task()
        if task is None or task.cancelling():
            await anyio.lowlevel.checkpoint()
            raise
        raise ProtocolError(
            ErrorCode.AGENT_UNREACHABLE,
            f"the connection to the agent of cluster {cluster} was closed during a call",
            "it is opened again on the next call",
        ) from None


def translate(error: grpc.aio.AioRpcError, cluster: str) -> ProtocolError:
    code = error.code()
    details = (error.details() or str(code))[:500]
    # CANCELLED here means our side closed the channel under a call (a stop or down).
    if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED,
                grpc.StatusCode.CANCELLED):
        return ProtocolError(
            ErrorCode.AGENT_UNREACHABLE,
            f"the agent of cluster {cluster} is not answering: {details}",
            f"check it with `clusterctl status --refresh {cluster}`; "
            f"`clusterctl launch -c {cluster}` repairs the runtime",
        )
    if code == grpc.StatusCode.NOT_FOUND:
        return ProtocolError(ErrorCode.JOB_NOT_FOUND, f"{cluster}: {details}",
                             f"see `clusterctl queue {cluster}`")
    if code == grpc.StatusCode.FAILED_PRECONDITION and details.startswith(
            VERSION_MISMATCH_PREFIX):
        return version_mismatch(cluster, details.removeprefix(VERSION_MISMATCH_PREFIX).strip())
    if code == grpc.StatusCode.UNIMPLEMENTED:
        return version_mismatch(cluster, f"it lacks a call this daemon makes ({details})")
    if code == grpc.StatusCode.UNAUTHENTICATED:
        return ProtocolError(
            ErrorCode.AGENT_UNREACHABLE,
            f"the agent of cluster {cluster} refused the daemon's credential: {details}",
            f"`clusterctl launch -c {cluster}` restarts the runtime with a new token",
        )
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        return ProtocolError(
            ErrorCode.AGENT_UNREACHABLE,
            f"the agent of cluster {cluster} is at its limit: {details}",
            "fewer followed logs at once, or try again in a moment",
        )
    if code == grpc.StatusCode.FAILED_PRECONDITION:
        return ProtocolError(ErrorCode.RESOURCES_UNAVAILABLE, f"{cluster}: {details}",
                             "ask for less, or launch a bigger cluster")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return ProtocolError(ErrorCode.INVALID_TASK, f"{cluster}: {details}")
    return ProtocolError(ErrorCode.INTERNAL, f"agent of {cluster} failed: {code.name}: {details}")


class AgentClient:
    def __init__(self, cluster: str, endpoint: str, token: str) -> None:
        self.cluster = cluster
        self.endpoint = endpoint
        self._token = token
        self._proved = False
        # Nonces the agent issued us, each with when we stop using it (monotonic time).
        self._nonces: collections.deque[tuple[bytes, float]] = collections.deque()
        self._refilling = anyio.Lock()
        self._finished = FinishedJobCache()
        self._channel = grpc.aio.insecure_channel(
            endpoint,
            options=[
                ("grpc.max_receive_message_length", MAX_REPLY_BYTES),
                ("grpc.enable_retries", 0),
                # A subchannel of its own: gRPC otherwise shares one per address between
                # channels, and a new channel would inherit an old one's reconnect back-off.
                ("grpc.use_local_subchannel_pool", 1),
            ],
        )
        self._jobs = pb_grpc.JobsServiceStub(self._channel)
        self._autostop = pb_grpc.AutostopServiceStub(self._channel)
        self._health = pb_grpc.HealthServiceStub(self._channel)
        self._usage = pb_grpc.UsageServiceStub(self._channel)

    async def handshake(self) -> None:
        """Make the agent prove it holds the cluster's token (then check its version): until
        it has, nothing but a nonce is sent to whatever answers at the endpoint."""
        nonce = new_nonce()
        try:
            async with closed_under_the_call(self.cluster):
                reply = await self._health.Handshake(pb.HandshakeRequest(client_nonce=nonce),
                                                     timeout=HANDSHAKE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            if error.code() == grpc.StatusCode.UNIMPLEMENTED:
                raise version_mismatch(
                    self.cluster, "it was started by an older clusterd (it has no handshake)"
                ) from None
            raise translate(error, self.cluster) from None
        if not proof_is_valid(self._token, nonce, reply.server_nonce, reply.proof):
            raise ProtocolError(
                ErrorCode.AGENT_UNREACHABLE,
                f"what answers at the agent socket of cluster {self.cluster} cannot prove it "
                "holds the cluster's token, so it is not that cluster's agent (a stale socket "
                "someone else answers?); nothing was sent to it",
                f"`clusterctl launch -c {self.cluster}` restarts the runtime",
            )
        if reply.version != __version__ or reply.protocol != AGENT_PROTOCOL:
            raise version_mismatch(
                self.cluster, f"it runs clusterd {reply.version} (protocol {reply.protocol}); "
                f"this daemon is {__version__} (protocol {AGENT_PROTOCOL})")
        self._proved = True

    def _take_nonce(self) -> bytes | None:
        now = time.monotonic()
        while self._nonces:
            nonce, use_by = self._nonces.popleft()
            if now < use_by:
                return nonce
        return None

    async def _refill(self) -> None:
        asked = time.monotonic()
        try:
            async with closed_under_the_call(self.cluster):
                reply = await self._health.IssueNonces(
                    pb.IssueNoncesRequest(count=NONCE_BATCH), timeout=HANDSHAKE_TIMEOUT_S)
        except grpc.aio.AioRpcError as error:
            raise translate(error, self.cluster) from None
        nonces = [n for n in reply.nonces[:NONCE_BATCH] if len(n) == NONCE_BYTES]
        if not nonces or not 0 < reply.ttl_s <= MAX_NONCE_TTL_S:
            raise ProtocolError(
                ErrorCode.AGENT_UNREACHABLE,
                f"the agent of cluster {self.cluster} issued no usable nonce to make a "
                f"credential over ({len(nonces)} for {reply.ttl_s} s)",
                f"`clusterctl launch -c {self.cluster}` restarts the runtime",
            )
        use_by = asked + reply.ttl_s * NONCE_USE_WITHIN
        self._nonces.extend((nonce, use_by) for nonce in nonces)

    async def _credential(self) -> str:
        """A credential for one call: over a nonce of ours, fetching more when we have none
        (a few times at most: an agent whose nonces expire at once must not keep us asking)."""
        if not self._proved:
            await self.handshake()
        for _ in range(3):
            if (nonce := self._take_nonce()) is not None:
                return daemon_credential(self._token, nonce)
            async with self._refilling:
                if not self._nonces:  # else another task refilled while we waited
                    await self._refill()
        raise ProtocolError(
            ErrorCode.AGENT_UNREACHABLE,
            f"the nonces the agent of cluster {self.cluster} issues expire before they can "
            "be used", f"`clusterctl launch -c {self.cluster}` restarts the runtime",
        )

    def _retry_with_fresh_nonces(self, error: grpc.aio.AioRpcError, attempt: int) -> bool:
        """After a first refusal of our credential: the agent no longer knows the nonces we
        hold (it restarted, or dropped its oldest). It refuses before running anything, so the
        call is safe to make again, once, with a nonce fetched afresh."""
        if attempt > 1 or error.code() != grpc.StatusCode.UNAUTHENTICATED:
            return False
        self._nonces.clear()
        return True

    async def _metadata(self) -> tuple[tuple[str, str], ...]:
        return (*request_metadata(), (AUTH_METADATA, await self._credential()))

    def token_is(self, token: str) -> bool:
        return hmac.compare_digest(self._token, token)

    def usable(self, endpoint: str, token: str) -> bool:
        """For this endpoint and token, and not waiting out gRPC's reconnect back-off (after
        the agent went away for a moment: a restart, a dropped tunnel), where every call
        would fail at once with the old error."""
        state = self._channel.get_state(try_to_connect=False)
        return (self.endpoint == endpoint and self.token_is(token)
                and state != grpc.ChannelConnectivity.TRANSIENT_FAILURE)

    async def close(self, grace_s: float | None = None) -> None:
        """Close the channel; with a grace period, calls in flight may first read what has
        already arrived (a log stream its final status)."""
        with contextlib.suppress(Exception):
            await self._channel.close(grace=grace_s)

    async def _call(self, method: Callable[..., Awaitable[T]], request: Any,
                    timeout_s: float = CALL_TIMEOUT_S) -> T:
        attempt = 0
        while True:
            attempt += 1
            metadata = await self._metadata()
            try:
                async with closed_under_the_call(self.cluster):
                    return await method(request, timeout=timeout_s, metadata=metadata)
            except grpc.aio.AioRpcError as error:
                if not self._retry_with_fresh_nonces(error, attempt):
                    raise translate(error, self.cluster) from None

    async def health(self, timeout_s: float = 5.0) -> Health:
        return health_from_pb(
            await self._call(self._health.GetHealth, pb.GetHealthRequest(), timeout_s))

    async def check_version(self) -> Health:
        """The agent's health, once it has proved itself and its version (the handshake)."""
        health = await self.health()
        if health.version != __version__ or health.protocol != AGENT_PROTOCOL:
            raise ProtocolError(
                ErrorCode.AGENT_VERSION_MISMATCH,
                f"the agent of cluster {self.cluster} runs clusterd {health.version} "
                f"(protocol {health.protocol}); this daemon is {__version__} "
                f"(protocol {AGENT_PROTOCOL})",
                f"re-launch to upgrade it: clusterctl launch -c {self.cluster}",
            )
        return health

    async def add_job(self, spec: JobSpec) -> SubmittedJob:
        reply = await self._call(self._jobs.AddJob,
                                 pb.AddJobRequest(spec=job_spec_to_pb(spec)))
        return SubmittedJob(job_id=reply.job_id, log_dir=reply.log_dir, task_id=reply.task_id)

    async def queue(self, skip_finished: bool = False) -> list[Job]:
        reply = await self._call(
            self._jobs.GetJobQueue, pb.GetJobQueueRequest(skip_finished=skip_finished)
        )
        return self._finished.convert(reply.jobs)

    async def jobs(self, job_ids: list[int]) -> list[Job]:
        reply = await self._call(self._jobs.GetJobStatus, pb.GetJobStatusRequest(job_ids=job_ids))
        return [job_from_pb(job) for job in reply.jobs]

    async def cancel(self, job_ids: list[int], cancel_all: bool) -> list[int]:
        reply = await self._call(
            self._jobs.CancelJobs, pb.CancelJobsRequest(job_ids=job_ids, all=cancel_all),
            timeout_s=60,
        )
        return list(reply.cancelled_job_ids)

    async def tail(
        self, job_id: int, *, follow: bool, tail_lines: int, offset: int
    ) -> AsyncIterator[LogChunk]:
        request = pb.TailLogsRequest(
            job_id=job_id, follow=follow, tail_lines=tail_lines, start_offset=offset
        )
        attempt = 0
        while True:
            attempt += 1
            call = self._jobs.TailLogs(request, metadata=await self._metadata())
            received = False
            try:
                async with closed_under_the_call(self.cluster):
                    async for message in call:
                        received = True
                        yield log_chunk_from_pb(message)
                return
            except grpc.aio.AioRpcError as error:
                if received or not self._retry_with_fresh_nonces(error, attempt):
                    raise translate(error, self.cluster) from None
            finally:
                call.cancel()

    async def set_autostop(self, setting: AutostopSetting) -> None:
        # The wire's "cancel" is a negative idle time.
        idle_minutes = -1.0 if setting.idle_minutes is None else setting.idle_minutes
        await self._call(
            self._autostop.SetAutostop,
            pb.SetAutostopRequest(idle_minutes=idle_minutes, down=setting.down,
                                  wait_for=WAIT_FOR_TO_PB[setting.wait_for]),
        )

    async def idle_info(self) -> IdleInfo:
        reply = await self._call(self._autostop.GetIdleInfo, pb.GetIdleInfoRequest())
        return IdleInfo(idle_since=reply.idle_since or None, active_jobs=reply.active_jobs,
                        ssh_sessions=reply.ssh_sessions)


    async def node_usage(self, since: float = 0.0) -> tuple[float, list[NodeUsage]]:
        """The time between samples, and every node's samples newer than `since`."""
        reply = await self._call(self._usage.GetNodeUsage,
                                 pb.GetNodeUsageRequest(since=since))
        return reply.interval_s, [node_usage_from_pb(n) for n in reply.nodes]


class AgentConnections:
    """One client per cluster, made (handshake and version check) on first use."""

    def __init__(self) -> None:
        self._clients: dict[str, AgentClient] = {}
        self._connecting: dict[str, anyio.Lock] = {}

    async def get(self, cluster: str, endpoint: str, token: str) -> AgentClient:
        client = self._clients.get(cluster)
        if client is not None and client.usable(endpoint, token):
            return client
        lock = self._connecting.setdefault(cluster, anyio.Lock())
        async with lock:
            client = self._clients.get(cluster)
            if client is not None and client.usable(endpoint, token):
                return client
            if client is not None:
                await self.close(cluster)
            client = AgentClient(cluster, endpoint, token)
            try:
                await client.handshake()
                await client.check_version()
            except BaseException:
                await client.close()
                raise
            self._clients[cluster] = client
            return client

    async def close(self, cluster: str, grace_s: float | None = None) -> None:
        client = self._clients.pop(cluster, None)
        lock = self._connecting.get(cluster)
        if lock is not None and not lock.locked():
            del self._connecting[cluster]
        if client is not None:
            await client.close(grace_s)

    async def close_all(self) -> None:
        for cluster in list(self._clients):
            await self.close(cluster)
