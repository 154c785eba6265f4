"""Runs one job across its nodes: setup on every node, then run on every node, gang-scheduled
in the job's placement group (one bundle per node).

Failure rules (as SkyPilot's): a setup failure on any node is FAILED_SETUP naming every failed
node; a run failure on one node kills the others and the job is FAILED naming the first real
failure (the 137s of the nodes we killed are not it); exit 139 is named a segmentation fault.
A node that leaves the Ray cluster while its rank runs (dead, or cut off: Ray's GCS stops
hearing from it) fails that rank, even when Ray itself never fails the task: a node cut off
by the network keeps its processes, and Ray would wait for them forever.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import ray
import structlog
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from clusterctl.protocol import JobStatus
from clusterd import log
from clusterd.agent import node_tasks
from clusterd.agent.in_memory import InMemory
from clusterd.agent.jobs_db import Job, JobStore
from clusterd.agent.logs import JobLog, LogHub, NodePrefixer

logger = log.get("clusterd.agent.runner")

CANCELLED_BY_USER = "cancelled by user"
JOB_TAG = node_tasks.JOB_TAG
FLUSH_TIMEOUT_S = 3600.0  # uploads of a job's writes to its bucket mounts, at most
NODE_WATCH_S = 2.0  # how often a running job checks that its nodes are still in the cluster
NODE_LEFT = "its node left the Ray cluster (dead, or unreachable from the head)"
SIGNAL_NAMES = {130: "interrupted (SIGINT)", 134: "aborted (SIGABRT)", 137: "killed (SIGKILL)",
                139: "a segmentation fault", 143: "terminated (SIGTERM)"}


@dataclasses.dataclass(frozen=True)
class NodeSlot:
    """Where one rank runs: a bundle of the job's placement group on one node."""

    rank: int
    bundle_index: int
    node_id: str
    ip: str

    @property
    def label(self) -> str:
        return "(head, rank=0)" if self.rank == 0 else f"(worker{self.rank}, rank={self.rank})"


@dataclasses.dataclass
class RankResult:
    rank: int
    exit_code: int | None = None
    error: str | None = None  # the rank's task itself failed (node lost, worker crashed)
    killed_by_us: bool = False
    finished_at: float = 0.0


def describe_exit(code: int) -> str:
    if code in SIGNAL_NAMES:
        return f"{SIGNAL_NAMES[code]} (exit code {code})"
    return f"exit code {code}"


def skypilot_env(
    job: Job, slots: list[NodeSlot], rank: int, *, phase: str, gpus_per_node: float
) -> dict[str, str]:
    ips = "\n".join(slot.ip for slot in slots)
    env = {
        "SKYPILOT_NODE_IPS": ips,
        "SKYPILOT_NUM_NODES": str(len(slots)),
        "SKYPILOT_NUM_GPUS_PER_NODE": _count(gpus_per_node),
        # The submitter's own (a managed job's, the same in every attempt), else the agent's.
        "SKYPILOT_TASK_ID": job.spec.get("task_id") or job.task_id,
        # Inherited by everything the job starts, even what leaves its session: the handle
        # by which a restarted agent finds a dead agent's jobs (see node_tasks.kill_tagged).
        JOB_TAG: job.task_id,
        "SKYPILOT_CLUSTER_INFO": json.dumps(cluster_info(job.spec, len(slots))),
        # Who submitted the job on the laptop (SkyPilot sets it; the node's user may differ).
        "SKYPILOT_USER": job.user,
    }
    if phase == "setup":
        env["SKYPILOT_SETUP_NODE_RANK"] = str(rank)
        env["SKYPILOT_SETUP_NODE_IPS"] = ips
        # SkyPilot's setup also sees the run-time names; tasks written for it may read either.
        env["SKYPILOT_NODE_RANK"] = str(rank)
    else:
        env["SKYPILOT_NODE_RANK"] = str(rank)
    return env


def cluster_info(spec: dict[str, Any], num_nodes: int) -> dict[str, Any]:
    """SKYPILOT_CLUSTER_INFO as SkyPilot writes it (task files read `.cloud`, `.region` and
    `.zone` from it; null where the provider has none), plus the node count."""
    return {
        "cluster_name": spec.get("cluster_name", ""),
        "cloud": spec.get("cloud") or None,
        "region": spec.get("region") or None,
        "zone": spec.get("zone") or None,
        "num_nodes": num_nodes,
    }


def _count(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


class JobRun:
    """One job from ready placement group to final status."""

    def __init__(
        self,
        job: Job,
        *,
        store: JobStore,
        hub: LogHub,
        slots: list[NodeSlot],
        placement_group: Any,
        in_memory: InMemory,
        on_finished: Callable[[Job], None],
        release: Callable[[Job, Any, list[NodeSlot]], Awaitable[None]],
        alive_nodes: Callable[[], Awaitable[set[str]]],
        mounts_dir: str = "",
    ) -> None:
        self.job = job
        # Each node's bucket mounts' state ('~' for the node user's home): what they hold
        # is uploaded before the job is reported finished.
        self._mounts_dir = mounts_dir
        self._alive_nodes = alive_nodes
        self._store = store
        self._hub = hub
        self._slots = slots
        self._pg = placement_group
        self._in_memory = in_memory  # secrets and the like: never in the job's record
        self._on_finished = on_finished
        self._release = release  # the placement group, once the job is done with it
        self._cancel_requested = False
        self._cancel_reason = CANCELLED_BY_USER
        # Set once one rank failed in a fail-fast phase: ranks that start later die at once.
        self._aborting = False
        self._running: dict[int, dict[str, Any]] = {}  # rank -> {pid, create_time}
        self._phase_scope: anyio.CancelScope | None = None
        self._log: JobLog | None = None
        self._prefixers = (
            {s.rank: NodePrefixer(s.label) for s in slots} if len(slots) > 1 else {}
        )

    async def request_cancel(self, reason: str = CANCELLED_BY_USER) -> None:
        self._cancel_requested = True
        self._cancel_reason = reason
        await self._kill_all(exclude=None)
        # Whatever left the ranks' sessions (a daemonized child) still carries the tag.
        for node_id in {slot.node_id for slot in self._slots}:
            await kill_tagged_on_node(node_id, self.job.task_id)

    async def execute(self) -> None:
        job = self.job
        structlog.contextvars.bind_contextvars(job_id=job.job_id,
                                               request_id=job.spec.get("request_id"))
        self._log = self._hub.open(job.job_id)
        try:
            status, reason, codes = await self._execute()
        except Exception as exc:  # the driver (this agent) failed, not the user's code
            logger.exception("job driver failed", job_id=job.job_id)
            status, reason, codes = JobStatus.FAILED_DRIVER, f"agent error: {exc}", []
        if self._cancel_requested and status != JobStatus.SUCCEEDED:
            status, reason = JobStatus.CANCELLED, self._cancel_reason
        with anyio.CancelScope(shield=True):
            problem = await self._flush_mounts()
            if problem and status == JobStatus.SUCCEEDED:
                status, reason = JobStatus.FAILED, problem
            self._flush_prefixers()
            await self._store.update(
                job, status=status, failure_reason=reason, exit_codes=codes,
                ended_at=time.time(), processes=[],
            )
            self._hub.close(job.job_id)
            await self._release(job, self._pg, self._slots)
        logger.info("job finished", job_id=job.job_id, status=str(status), reason=reason)
        self._on_finished(job)

    async def _execute(self) -> tuple[JobStatus, str, list[int]]:
        spec = self._in_memory.spec(self.job.spec)
        if spec.get("setup"):
            results = await self._run_phase("setup", spec["setup"], fail_fast=False,
                                            status=JobStatus.SETTING_UP)
            if self._cancel_requested:
                return JobStatus.CANCELLED, self._cancel_reason, []
            failed = [r for r in results if r.error or r.exit_code != 0]
            if failed:
                named = "; ".join(self._describe(r) for r in failed)
                return JobStatus.FAILED_SETUP, f"setup failed on {named}", _codes(results)
        results = await self._run_phase("run", spec.get("run") or "", fail_fast=True,
                                        status=JobStatus.RUNNING, started_at=time.time())
        if self._cancel_requested:
            return JobStatus.CANCELLED, self._cancel_reason, _codes(results)
        failed = [r for r in results if r.error or r.exit_code != 0]
        if not failed:
            return JobStatus.SUCCEEDED, "", _codes(results)
        genuine = sorted((r for r in failed if not r.killed_by_us), key=lambda r: r.finished_at)
        genuine = genuine or failed
        return JobStatus.FAILED, self._describe(genuine[0]), _codes(results)

    async def _flush_mounts(self) -> str | None:
        """Every node's bucket mounts have uploaded what the job wrote (MOUNT_CACHED writes
        back behind the job); what went wrong, if anything. Nothing to ask when the head has
        no mounts (the daemon mounts a task's buckets on every node alike)."""
        if not self._mounts_dir or not os.path.exists(
                os.path.join(os.path.expanduser(self._mounts_dir), "mounts.json")):
            return None
        problems: list[str] = []

        async def flush(node_id: str) -> None:
            try:
                with anyio.fail_after(FLUSH_TIMEOUT_S + 30):
                    await node_tasks.pinned(node_tasks.flush_bucket_mounts, node_id).remote(
                        self._mounts_dir, FLUSH_TIMEOUT_S)
            except (TimeoutError, ray.exceptions.RayError) as exc:
                problems.append(f"node {node_id[:8]}: {str(exc).splitlines()[-1][:300]}")

        async with anyio.create_task_group() as group:
            for node_id in {slot.node_id for slot in self._slots}:
                group.start_soon(flush, node_id)
        if problems:
            return "writes to a bucket mount were not all uploaded: " + "; ".join(problems)
        return None

    def _describe(self, result: RankResult) -> str:
        slot = self._slots[result.rank]
        where = f"rank {result.rank} ({slot.ip})"
        if result.error:
            return f"{where}: {result.error}"
        assert result.exit_code is not None
        return f"{where} exited with {describe_exit(result.exit_code)}"

    async def _set_status(self, status: JobStatus, **fields: Any) -> None:
        await self._store.update(self.job, status=status, **fields)
        self._hub.notify(self.job.job_id)

    async def _run_phase(self, phase: str, script: str, *, fail_fast: bool, status: JobStatus,
                         **fields: Any) -> list[RankResult]:
        """Run `script` on every node; the job's `status` (and `fields`) are written while the
        nodes start it, not before: the write is no part of the time to the first line."""
        self._aborting = False
        results = [RankResult(slot.rank) for slot in self._slots]
        gpus = float(self.job.spec.get("resources", {}).get("gpus", 0) or 0)
        envs = self._in_memory.envs(self.job.spec.get("envs", {}))
        workdir = self.job.spec.get("workdir", "")
        image = self.job.spec.get("container_image", "")
        scopes = {slot.rank: anyio.CancelScope() for slot in self._slots}
        async with anyio.create_task_group() as watching:
            watching.start_soon(self._watch_nodes, results, scopes)
            async with anyio.create_task_group() as group:
                for slot in self._slots:
                    env = {**envs, **skypilot_env(self.job, self._slots, slot.rank, phase=phase,
                                                  gpus_per_node=gpus)}
                    strategy = PlacementGroupSchedulingStrategy(
                        self._pg, placement_group_bundle_index=slot.bundle_index
                    )
                    stream = node_tasks.run_script.options(scheduling_strategy=strategy).remote(
                        script, env, workdir, image
                    )
                    group.start_soon(self._consume, slot, stream, results, fail_fast,
                                     scopes[slot.rank])
                await self._set_status(status, **fields)
            watching.cancel_scope.cancel()
        return results

    async def _watch_nodes(self, results: list[RankResult],
                           scopes: dict[int, anyio.CancelScope]) -> None:
        """Fail the ranks whose node is no longer alive in Ray (stops at cancel)."""
        while True:
            await anyio.sleep(NODE_WATCH_S)
            try:
                with anyio.fail_after(30):
                    alive = await self._alive_nodes()
            except (TimeoutError, ray.exceptions.RayError) as exc:
                logger.warning("cannot list the cluster's nodes", error=str(exc))
                continue
            for slot in self._slots:
                result = results[slot.rank]
                if slot.node_id not in alive and result.exit_code is None \
                        and result.error is None:
                    logger.warning("a job's node left the cluster", job_id=self.job.job_id,
                                   rank=slot.rank, ip=slot.ip)
                    result.error = NODE_LEFT
                    scopes[slot.rank].cancel()

    async def _consume(
        self, slot: NodeSlot, stream: Any, results: list[RankResult], fail_fast: bool,
        scope: anyio.CancelScope,
    ) -> None:
        result = results[slot.rank]
        try:
            with scope:
                await self._relay(slot, stream, result)
        except ray.exceptions.RayError as exc:
            result.error = _ray_failure(exc)
        finally:
            self._running.pop(slot.rank, None)
            result.finished_at = time.monotonic()
        failed = result.error is not None or result.exit_code != 0
        if failed and fail_fast and not self._cancel_requested:
            self._aborting = True
            for other in results:
                if other.rank != slot.rank and other.exit_code is None and other.error is None:
                    other.killed_by_us = True
            await self._kill_all(exclude=slot.rank)

    async def _relay(self, slot: NodeSlot, stream: Any, result: RankResult) -> None:
        """One rank's stream: its output into the log, its pid and exit code into result."""
        async for ref in stream:
            kind, value = await ref
            if kind == "output":
                self._write(slot.rank, value)
            elif kind == "started":
                self._running[slot.rank] = value
                await self._record_processes()
                if self._cancel_requested or self._aborting:
                    await self._kill_rank(slot.rank)
            elif kind == "exit":
                result.exit_code = int(value)

    def _write(self, rank: int, data: bytes) -> None:
        assert self._log is not None
        prefixer = self._prefixers.get(rank)
        self._log.write(prefixer.feed(data) if prefixer else data)

    def _flush_prefixers(self) -> None:
        if self._log is None:
            return
        for prefixer in self._prefixers.values():
            self._log.write(prefixer.flush())

    async def _record_processes(self) -> None:
        processes = [
            {"rank": rank, "node_id": self._slots[rank].node_id, **info}
            for rank, info in sorted(self._running.items())
        ]
        await self._store.update(self.job, processes=processes)

    async def _kill_all(self, exclude: int | None) -> None:
        async with anyio.create_task_group() as group:
            for rank in list(self._running):
                if rank != exclude:
                    group.start_soon(self._kill_rank, rank)

    async def _kill_rank(self, rank: int) -> None:
        info = self._running.get(rank)
        if info is None:
            return
        await kill_on_node(self._slots[rank].node_id, info["pid"], info.get("create_time"))


async def _kill_on_node(node_id: str, task: Any, *args: Any, failure: str,
                        **log_fields: Any) -> None:
    """Run a killing task on that node; a node that cannot be reached is only logged."""
    try:
        with anyio.fail_after(30):
            await node_tasks.pinned(task, node_id).remote(*args)
    except (TimeoutError, ray.exceptions.RayError) as exc:
        logger.warning(failure, node_id=node_id, error=str(exc), **log_fields)


async def kill_on_node(node_id: str, pid: int, create_time: float | None) -> None:
    await _kill_on_node(node_id, node_tasks.kill_tree, pid, create_time,
                        failure="could not kill process", pid=pid)


async def kill_tagged_on_node(node_id: str, task_id: str) -> None:
    await _kill_on_node(node_id, node_tasks.kill_tagged, task_id,
                        failure="could not sweep a job's processes")


def _codes(results: list[RankResult]) -> list[int]:
    return [r.exit_code if r.exit_code is not None else -1 for r in results]


def _ray_failure(exc: Exception) -> str:
    if isinstance(exc, ray.exceptions.NodeDiedError | ray.exceptions.WorkerCrashedError):
        return f"its node or Ray worker died ({type(exc).__name__})"
    return f"Ray failed to run it: {type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
