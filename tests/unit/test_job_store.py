"""The agent's job store commits each write as it returns: a killed agent (no close, no
rollback) loses nothing the daemon was told."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent.jobs_db import JobStore

pytestmark = pytest.mark.anyio


def on_disk(path: Path) -> dict[int, tuple[str, str]]:
    """What another process reading the database sees now."""
    with sqlite3.connect(path) as other:
        rows = other.execute("SELECT job_id, status, failure_reason FROM jobs").fetchall()
    return {job_id: (status, reason) for job_id, status, reason in rows}


async def test_every_write_is_committed_before_it_returns(tmp_path: Path) -> None:
    path = tmp_path / "jobs.db"
    store = JobStore(path)
    await store.open()
    try:
        job = await store.add(name="j", user="u", spec={}, has_secrets=False,
                              resources_display="", num_nodes=1)
        assert on_disk(path) == {job.job_id: (str(JobStatus.INIT), "")}
        await store.update(job, status=JobStatus.FAILED, failure_reason="rank 0 exited")
        assert on_disk(path) == {job.job_id: (str(JobStatus.FAILED), "rank 0 exited")}
        await store.set_setting("autostop", "5")
        assert await store.get_setting("autostop") == "5"
        assert await store.prune(keep=0) == [job.job_id]
        assert on_disk(path) == {}
    finally:
        await store.close()
