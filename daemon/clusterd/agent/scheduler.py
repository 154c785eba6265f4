"""The job queue's scheduler: first in, first out, one placement group per job.

The oldest PENDING job gets a placement group (one bundle per node, STRICT_SPREAD) and waits
for Ray to reserve it; jobs behind it wait their turn even if they would fit, so a big job is
never starved by small ones. Once reserved, the job runs and the next one is considered. A
finished job's group goes to the next job of the same shape if one comes soon (placement.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import getpass
import ipaddress
import time
from typing import Any

import anyio
import ray
import structlog
from ray.util.placement_group import placement_group

from clusterctl.protocol import JobStatus
from clusterd import log
from clusterd.agent import node_tasks
from clusterd.agent.in_memory import InMemory
from clusterd.agent.jobs_db import Job, JobStore
from clusterd.agent.logs import LogHub
from clusterd.agent.placement import PlacementPool, Shape, remove, shape_of
from clusterd.agent.runner import CANCELLED_BY_USER, JobRun, NodeSlot, kill_on_node

logger = log.get("clusterd.agent.scheduler")

# How long a view of the cluster's nodes may say yes to a job's demand (a GCS round trip,
# ~1 ms, spared on a burst of submissions).
NODE_VIEW_S = 2.0


class Infeasible(Exception):
    """The job can never run on this cluster as it is."""


@dataclasses.dataclass(frozen=True)
class NodeView:
    node_id: str
    ip: str
    resources: dict[str, float]


def _bundles(job: Job) -> list[dict[str, float]]:
    return [_bundle(job.spec.get("resources", {})) for _ in range(job.num_nodes)]


def _bundle(resources: dict[str, Any]) -> dict[str, float]:
    # Memory sizes the nodes (the placement chose them for it), as in SkyPilot, and is no
    # part of the bundle: Ray counts a node's memory as what is left beside its object store
    # (in a pod, of the pod's limit), so a task asking for all of a node's memory, as
    # SkyPilot's tasks do, would never fit.
    bundle = {"CPU": float(resources.get("cpus") or 0)}
    if resources.get("gpus"):
        bundle["GPU"] = float(resources["gpus"])
    return {k: v for k, v in bundle.items() if v > 0} or {"CPU": 0.001}


def _ip_key(ip: str) -> tuple[int, Any]:
    try:
        return (0, ipaddress.ip_address(ip))
    except ValueError:
        return (1, ip)


class Scheduler:
    def __init__(self, store: JobStore, hub: LogHub, cluster_name: str,
                 mounts_dir: str = "") -> None:
        self._mounts_dir = mounts_dir
        self._store = store
        self._hub = hub
        self._cluster_name = cluster_name
        self._in_memory: dict[int, InMemory] = {}
        self._runs: dict[int, JobRun] = {}
        # The job waiting for a reservation of its own: its id, the scope of that wait, and
        # its shape (a job of that shape finishing meanwhile hands it its group instead).
        self._waiting: tuple[int, anyio.CancelScope, Shape] | None = None
        self._handed: tuple[Any, list[NodeSlot]] | None = None
        self._placements = PlacementPool()
        self._wake = anyio.Event()
        self._drained = anyio.Event()
        self._task_group: anyio.abc.TaskGroup | None = None
        self._head_node_id: str | None = None
        self._recent_nodes: tuple[float, list[NodeView]] = (-NODE_VIEW_S, [])
        self.last_activity = time.time()

    # -- cluster view -----------------------------------------------------------------------

    async def nodes(self) -> list[NodeView]:
        # Abandoned on cancel: with the GCS gone, ray.nodes() retries for a long time, and a
        # stopping agent must not wait for it.
        raw = await anyio.to_thread.run_sync(ray.nodes, abandon_on_cancel=True)
        return [
            NodeView(n["NodeID"], n["NodeManagerAddress"], dict(n.get("Resources") or {}))
            for n in raw
            if n.get("Alive")
        ]

    async def _alive_node_ids(self) -> set[str]:
        return {n.node_id for n in await self.nodes()}

    async def on_every_node(self, task: Any, *args: Any, timeout_s: float = 20) -> list[Any]:
        """Run a Ray task once on each live node; results in node order (errors as None)."""
        nodes = await self.nodes()
        refs = [node_tasks.pinned(task, n.node_id).remote(*args) for n in nodes]
        results: list[Any] = [None] * len(refs)

        async def wait(index: int) -> None:
            with contextlib.suppress(ray.exceptions.RayError, TimeoutError), \
                    anyio.fail_after(timeout_s):
                results[index] = await refs[index]

        async with anyio.create_task_group() as group:
            for index in range(len(refs)):
                group.start_soon(wait, index)
        return results

    async def check_feasible(self, num_nodes: int, resources: dict[str, Any]) -> None:
        demand = _bundle(resources)
        # A view of the nodes from a moment ago answers yes as well as a fresh one (a node
        # lost since is the same race a fresh view has); only a no is checked afresh.
        seen_at, seen = self._recent_nodes
        if time.monotonic() - seen_at < NODE_VIEW_S and _fits(seen, num_nodes, demand):
            return
        nodes = await self.nodes()
        self._recent_nodes = (time.monotonic(), nodes)
        if num_nodes > len(nodes):
            raise Infeasible(
                f"the task asks for {num_nodes} nodes; this cluster has {len(nodes)}"
            )
        fitting = _fitting(nodes, demand)
        if len(fitting) < num_nodes:
            best = max(nodes, key=lambda n: n.resources.get("CPU", 0))
            have = ", ".join(f"{k}: {best.resources.get(k, 0):g}" for k in demand)
            raise Infeasible(
                f"the task asks per node for {_describe(demand)}; "
                f"{len(fitting)} of {len(nodes)} nodes can ever give that (largest: {have})"
            )

    # -- queue operations --------------------------------------------------------------------

    async def submit(self, spec: dict[str, Any], in_memory: InMemory) -> Job:
        """`spec` as it may be stored; `in_memory` (secrets, ...) is never written."""
        resources = spec.get("resources", {})
        num_nodes = int(spec.get("num_nodes") or 1)
        await self.check_feasible(num_nodes, resources)
        # The daemon request that submitted it, so the job's log lines can name it.
        spec = {**spec, "request_id": structlog.contextvars.get_contextvars().get("request_id")}
        job = await self._store.add(
            name=spec.get("name") or "job",
            user=spec.get("user") or getpass.getuser(),
            spec=spec,
            has_secrets=bool(in_memory),
            resources_display=spec.get("resources_display") or "",
            num_nodes=num_nodes,
        )
        stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(job.submitted_at))
        micros = int((job.submitted_at % 1) * 1e6)
        task_id = f"sky-{stamp}-{micros:06d}_{self._cluster_name}_{job.job_id}"
        if in_memory:
            self._in_memory[job.job_id] = in_memory
        await self._store.update(
            job,
            status=JobStatus.PENDING,
            task_id=task_id,
            log_dir=str(self._hub.log_dir(job.job_id)),
        )
        self.last_activity = time.time()
        self._poke()
        return job

    async def cancel(
        self, job_ids: list[int], cancel_all: bool, reason: str = CANCELLED_BY_USER
    ) -> list[int]:
        targets = self._store.active() if cancel_all else [
            job for job_id in job_ids if (job := self._store.get(job_id)) and job.active
        ]
        cancelled: list[int] = []
        async with anyio.create_task_group() as group:
            for job in targets:
                cancelled.append(job.job_id)
                run = self._runs.get(job.job_id)
                if run is not None:
                    group.start_soon(run.request_cancel, reason)
                    continue
                if self._waiting and self._waiting[0] == job.job_id:
                    self._waiting[1].cancel()
                await self._finish_unstarted(job, JobStatus.CANCELLED, reason)
        return cancelled

    async def fail_in_progress(self, reason: str) -> list[int]:
        """Jobs a previous agent left running (or waiting with secrets it no longer has)
        can't be reattached: kill what is left of them and say why."""
        failed: list[int] = []
        for job in self._store.active():
            if job.job_id in self._runs:
                continue
            if job.status in (JobStatus.SETTING_UP, JobStatus.RUNNING):
                for process in job.processes:
                    await kill_on_node(process["node_id"], process["pid"],
                                       process.get("create_time"))
                # Processes the dead agent never got to record are found by their tag.
                await self.on_every_node(node_tasks.kill_tagged, job.task_id, timeout_s=30)
            elif not (job.has_secrets and job.job_id not in self._in_memory):
                continue  # still PENDING and runnable: it keeps its place in the queue
            await self._finish_unstarted(job, JobStatus.FAILED_DRIVER, reason)
            failed.append(job.job_id)
        return failed

    async def _finish_unstarted(self, job: Job, status: JobStatus, reason: str) -> None:
        self._in_memory.pop(job.job_id, None)
        await self._store.update(job, status=status, failure_reason=reason, ended_at=time.time(),
                                 processes=[])
        self._hub.notify(job.job_id)
        self.last_activity = time.time()

    def active_jobs(self) -> int:
        return len(self._store.active())

    # -- the loop ------------------------------------------------------------------------------

    def _poke(self) -> None:
        self._wake.set()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED,
                  ) -> None:
        self._head_node_id = ray.get_runtime_context().get_node_id()
        async with anyio.create_task_group() as group:
            self._task_group = group
            task_status.started()
            while True:
                job = self._next_pending()
                if job is None:
                    self._wake = anyio.Event()
                    if self._next_pending() is None:
                        await self._wake.wait()
                    continue
                await self._start(job, group)

    def _next_pending(self) -> Job | None:
        pending = [j for j in self._store.active() if j.status == JobStatus.PENDING
                   and j.job_id not in self._runs]
        return min(pending, key=lambda j: j.job_id) if pending else None

    async def _start(self, job: Job, group: anyio.abc.TaskGroup) -> None:
        bundles = _bundles(job)
        shape = shape_of(bundles)
        parked = await self._placements.take(shape)
        if parked is not None:
            pg, slots = parked
        else:
            await self._placements.release_all()
            pg = placement_group(bundles, strategy="STRICT_SPREAD", name=f"job-{job.job_id}")
            with anyio.CancelScope() as scope:
                self._waiting = (job.job_id, scope, shape)
                await pg.ready()
            self._waiting = None
            handed, self._handed = self._handed, None
            if handed is not None:
                await remove(pg)
                pg, slots = handed
            elif scope.cancelled_caught:
                await remove(pg)
                return
            else:
                slots = await self._slots(pg)
        if not job.active:
            await remove(pg)
            return
        run = JobRun(
            job,
            store=self._store,
            hub=self._hub,
            slots=slots,
            placement_group=pg,
            in_memory=self._in_memory.pop(job.job_id, InMemory()),
            on_finished=self._finished,
            release=self._release,
            alive_nodes=self._alive_node_ids,
            mounts_dir=self._mounts_dir,
        )
        self._runs[job.job_id] = run
        group.start_soon(run.execute, name=f"job-{job.job_id}")

    async def _release(self, job: Job, pg: Any, slots: list[NodeSlot]) -> None:
        """A finished job's placement group: handed to the job waiting for a reservation of
        the same shape, if one is; else parked for the next job of its shape, unless a job of
        another shape waits (what this one holds may be what it waits for)."""
        shape = shape_of(_bundles(job))
        if self._waiting is None and self._task_group is not None:
            self._placements.park(pg, shape, slots, self._task_group)
        elif self._waiting is not None and self._waiting[2] == shape and self._handed is None:
            self._handed = (pg, slots)
            self._waiting[1].cancel()
        else:
            await remove(pg)

    def _finished(self, job: Job) -> None:
        self._runs.pop(job.job_id, None)
        self.last_activity = time.time()
        self._poke()
        if not self._runs:
            self._drained.set()

    async def drain(self) -> None:
        """Return once no job is running (after a cancel, once their processes are gone)."""
        while self._runs:
            self._drained = anyio.Event()
            await self._drained.wait()

    async def _slots(self, pg: Any) -> list[NodeSlot]:
        table = await anyio.to_thread.run_sync(ray.util.placement_group_table, pg,
                                               abandon_on_cancel=True)
        by_bundle: dict[int, str] = {int(k): v for k, v in table["bundles_to_node_id"].items()}
        ips = {n.node_id: n.ip for n in await self.nodes()}
        head = self._head_node_id
        order = sorted(
            by_bundle.items(),
            key=lambda item: (item[1] != head, _ip_key(ips.get(item[1], "")), item[1]),
        )
        return [
            NodeSlot(rank=rank, bundle_index=index, node_id=node_id, ip=ips.get(node_id, ""))
            for rank, (index, node_id) in enumerate(order)
        ]


def _fitting(nodes: list[NodeView], demand: dict[str, float]) -> list[NodeView]:
    return [n for n in nodes if all(n.resources.get(k, 0) >= v for k, v in demand.items())]


def _fits(nodes: list[NodeView], num_nodes: int, demand: dict[str, float]) -> bool:
    return len(_fitting(nodes, demand)) >= num_nodes


def _describe(demand: dict[str, float]) -> str:
    return ", ".join(f"{value:g} {key}" for key, value in demand.items())
