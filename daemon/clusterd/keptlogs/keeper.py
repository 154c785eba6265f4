"""Copies jobs' logs from UP clusters' heads to this machine while the jobs run (see store.py).

A keeper per UP cluster with unfinished jobs, in the keeper's own task group: each round asks
the agent for the job queue and copies what each unfinished job's log gained since the copy's
end, then waits `interval_s`. A cluster's keeper ends when every job's copy is complete; a job
submitted (`wake`) starts it again. On start, every UP cluster gets one (copies resume from
their length after a daemon restart).

Teardown calls `before_teardown` (under the cluster's lock, before its runtime stops): one last
round, bounded in time. Cluster events (UP, STOPPED, TERMINATED) keep the history's rows: the
row is written when a cluster comes up, and closed with the time and reason it went.

Copying for a cluster is serialised by a lock of its own: a keeper's round and a teardown's
last round never both append to one copy.
"""

from __future__ import annotations

import dataclasses
import functools
from collections import defaultdict
from pathlib import Path

import anyio
import anyio.abc

from clusterctl.protocol import ClusterStatus, ProtocolError
from clusterd import log
from clusterd.concurrency import survive
from clusterd.keptlogs.store import KeptCluster, KeptJob, KeptLogStore
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_types import Job
from clusterd.state.clusters import ClusterEvent, ClusterRecord, ClusterStore

logger = log.get("clusterd.keptlogs")
# Bytes of a log gathered before they are written to the copy.
WRITE_BYTES = 1024 * 1024


def kept_cluster(record: ClusterRecord) -> KeptCluster:
    placed = record.launched_resources
    return KeptCluster(name=record.name, provider=record.provider,
                       infra=placed.infra if placed is not None else record.provider,
                       created_at=record.created_at, launched_at=record.launched_at,
                       status=str(record.status))


class LogKeeper:
    def __init__(self, store: ClusterStore, access: AgentAccess, kept: KeptLogStore,
                 interval_s: float, last_round_s: float) -> None:
        self._store = store
        self._access = access
        self.kept = kept
        self._interval_s = interval_s
        self._last_round_s = last_round_s
        self._locks: defaultdict[str, anyio.Lock] = defaultdict(anyio.Lock)
        self._running: set[str] = set()
        self._woken: set[str] = set()  # asked for a round while their keeper was in one
        self._group: anyio.abc.TaskGroup | None = None

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        if not self.kept.enabled:
            task_status.started()
            return
        async with anyio.create_task_group() as group:
            self._group = group
            group.start_soon(self._watch_events)
            for record in self._store.all():
                if record.status == ClusterStatus.UP:
                    await self._remember(record)
                    self.wake(record.name)
            task_status.started()

    def wake(self, name: str) -> None:
        """A job was submitted to the cluster: copy its log (a keeper starts if none runs)."""
        if self._group is None:
            return
        if name in self._running:
            self._woken.add(name)
            return
        self._running.add(name)
        self._group.start_soon(self._keep, name)

    async def _keep(self, name: str) -> None:
        unfinished = True
        try:
            while True:
                self._woken.discard(name)
                record = self._store.get(name)
                if record is None or record.status != ClusterStatus.UP:
                    return

                async def one_round(record: ClusterRecord = record) -> None:
                    nonlocal unfinished
                    try:
                        unfinished = await self.copy_round(record)
                    except ProtocolError as exc:
                        # The head went away (a stop under way, a lost node): the next round,
                        # or the cluster's status, tells which.
                        logger.info("copying job logs failed; trying again", cluster=name,
                                    error=exc.message[:300])
                        await self._access.reset(name)

                await survive(f"kept logs of {name}", one_round)
                if not unfinished and name not in self._woken:
                    return
                await anyio.sleep(self._interval_s)
        finally:
            self._running.discard(name)

    async def before_teardown(self, record: ClusterRecord) -> None:
        """A last round before the cluster's runtime stops: bounded, and never raises (a head
        that does not answer keeps what was copied already)."""
        if not self.kept.enabled or record.status != ClusterStatus.UP:
            return
        with anyio.move_on_after(self._last_round_s) as scope:
            try:
                await self.copy_round(record)
            except (ProtocolError, OSError) as exc:
                logger.warning("last copy of job logs failed", cluster=record.name,
                               error=str(exc)[:300])
        if scope.cancelled_caught:
            logger.warning("last copy of job logs timed out", cluster=record.name)

    async def copy_round(self, record: ClusterRecord) -> bool:
        """Copy what the cluster's jobs' logs gained; True if some job is still unfinished.
        A managed job's cluster is left alone: the controller keeps its job's log already
        (`jobs logs`, managed/joblog.py)."""
        if record.owner is not None:
            return False
        async with self._locks[record.name]:
            directory = await self._remember(record)
            agent = await self._access.client(record)
            jobs = await agent.queue(False)
            known = await anyio.to_thread.run_sync(self.kept.jobs, directory)
            unfinished = False
            for job in jobs:
                copy = known.get(job.job_id)
                if copy is not None and (copy.complete or copy.dropped):
                    continue
                # Read again: copying another job may have dropped this one's (the cap).
                copy = (await anyio.to_thread.run_sync(self.kept.jobs, directory)).get(
                    job.job_id) or KeptJob(job.job_id)
                if copy.dropped:
                    continue
                done = await self._copy_job(record, directory, job, copy)
                unfinished = unfinished or not done
            return unfinished

    async def _copy_job(self, record: ClusterRecord, directory: Path, job: Job,
                        copy: KeptJob) -> bool:
        kept = self.kept
        copy = dataclasses.replace(copy, name=job.name, status=str(job.status),
                                   submitted_at=job.submitted_at, ended_at=job.ended_at,
                                   started_at=job.started_at, num_nodes=job.num_nodes,
                                   failure_reason=job.failure_reason)
        await anyio.to_thread.run_sync(kept.note_job, directory, copy)
        offset = await anyio.to_thread.run_sync(kept.resume_offset, directory, copy)
        agent = await self._access.client(record)
        # A finished job's log is read to its end with `follow` (the agent ends the stream
        # once the job's log is closed): then the copy is complete. A running one's is read
        # up to its current end.
        ended = job.status.is_terminal
        pending: list[bytes] = []
        size = 0
        try:
            async for chunk in agent.tail(job.job_id, follow=ended, tail_lines=0,
                                          offset=offset):
                if chunk.final:
                    break
                pending.append(chunk.data)
                size += len(chunk.data)
                if size >= WRITE_BYTES:  # a write (and a check of the caps) per MB
                    await anyio.to_thread.run_sync(kept.append, directory, copy,
                                                   b"".join(pending))
                    pending.clear()
                    size = 0
        finally:
            if pending:  # what came before a broken stream is kept: the copy stays a prefix
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(kept.append, directory, copy,
                                                   b"".join(pending))
        if ended:
            # Written after the last byte: a copy marked complete has all of the log.
            await anyio.to_thread.run_sync(kept.note_job, directory,
                                           dataclasses.replace(copy, complete=True))
        return ended

    async def _remember(self, record: ClusterRecord) -> Path:
        return await anyio.to_thread.run_sync(self.kept.remember, kept_cluster(record))

    async def _watch_events(self) -> None:
        """Status events keep the history's rows (a listener that falls behind is dropped:
        then it subscribes again)."""
        while True:
            with self._store.subscribe() as events:
                async for event in events:
                    if event.kind == "status":
                        await survive("kept logs history",
                                      functools.partial(self._on_status, event))

    async def _on_status(self, event: ClusterEvent) -> None:
        name = event.cluster
        if event.to_status == str(ClusterStatus.UP):
            record = self._store.get(name)
            if record is not None:
                await self._remember(record)
                self.wake(name)
            return
        if event.to_status not in (str(ClusterStatus.STOPPED), str(ClusterStatus.TERMINATED)):
            return
        async with self._locks[name]:
            directory = await anyio.to_thread.run_sync(self.kept.latest, name)
            if directory is None:
                return
            gone = event.to_status == str(ClusterStatus.TERMINATED)
            await anyio.to_thread.run_sync(
                self.kept.close_out, directory, str(event.to_status), event.reason,
                event.ts if gone else None)
        if gone:
            self._locks.pop(name, None)
