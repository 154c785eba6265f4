"""A job's kept log, streamed as its live log is (`logs CLUSTER JOB` on a stopped or gone
cluster): a `kept_log` event first (that this is the kept copy, and whether it is complete),
then `log` events, then the final reply with the job's status as the copy last saw it."""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError, exit_code_for_job
from clusterd.keptlogs.store import KeptJob, KeptLogStore

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]


def _when(ts: float | None) -> str:
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) if ts else "?"


def describe(name: str, directory: Path, job: KeptJob, store: KeptLogStore) -> str:
    cluster = store.cluster(directory)
    where = "stopped"
    if cluster is not None and cluster.torn_down_at is not None:
        where = f"torn down {_when(cluster.torn_down_at)}"
    if job.dropped:
        state = f"not kept: {job.dropped}"
    elif job.complete:
        state = "complete"
    else:
        state = "incomplete: the cluster went before the job's log was all copied"
    return f"kept copy of job {job.job_id}'s log (cluster {name}, {where}); {state}"


async def stream_kept(store: KeptLogStore, name: str, directory: Path, job_id: int | None,
                      tail: int, offset: int | None, emit: Emit) -> dict[str, Any]:
    """Send the kept copy (from `offset` in it, if given: offsets are the copy's); JOB_NOT_FOUND
    if the cluster's copies have no such job."""
    jobs = await anyio.to_thread.run_sync(store.jobs, directory)
    job = jobs.get(job_id) if job_id else (jobs[max(jobs)] if jobs else None)
    if job is None:
        raise ProtocolError(
            ErrorCode.JOB_NOT_FOUND,
            f"cluster {name} kept no log of job {job_id}" if job_id
            else f"cluster {name} kept no job logs",
            f"see `clusterctl history {name}`")
    complete = job.complete and not job.dropped
    note = await anyio.to_thread.run_sync(describe, name, directory, job, store)
    await emit("kept_log", {"cluster": name, "job_id": job.job_id, "complete": complete,
                            "note": note})
    files = store.files(directory)
    if offset is None:
        offset = 0
        if tail > 0:
            offset = await anyio.to_thread.run_sync(files.tail_start, job.job_id, tail)
    while chunk := await anyio.to_thread.run_sync(files.read, job.job_id, offset):
        offset += len(chunk)
        await emit("log", {"data": chunk, "offset": offset, "job_id": job.job_id})
    return {"cluster": name, "job_id": job.job_id, "status": job.status,
            "failure_reason": job.failure_reason if job.status != "SUCCEEDED" else "",
            "offset": offset, "exit_code": int(exit_code_for_job(job.status)),
            "kept": {"complete": complete}}
