"""Job statuses across the agent's API, and the daemon's finished-job maps."""

from __future__ import annotations

import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.wire import status_from_pb, status_to_pb
from clusterd.runtime.agent_client import job_from_pb
from clusterd.runtime.agent_types import Job
from clusterd.services.jobs import FinishedJobs


def test_every_status_crosses_and_comes_back() -> None:
    for status in JobStatus:
        assert status_from_pb(status_to_pb(status)) is status
        assert pb.JobStatus.Name(status_to_pb(status)) == f"JOB_STATUS_{status.value}"
    with pytest.raises(ValueError, match="unknown job status"):
        status_from_pb(pb.JOB_STATUS_UNSPECIFIED)


def job(job_id: int, status: JobStatus, ended_at: float = 0.0, task_id: str = "") -> Job:
    return job_from_pb(pb.Job(
        job_id=job_id, name="j", status=status_to_pb(status), submitted_at=1.0,
        ended_at=ended_at, task_id=task_id or f"sky-2026-12-02-00-00-00-0_c_{job_id}"))


def test_a_finished_jobs_map_is_made_once_and_an_unfinished_ones_each_time() -> None:
    maps = FinishedJobs()
    running = job(1, JobStatus.RUNNING)
    assert maps.wire(running) is not maps.wire(running)
    done = job(2, JobStatus.SUCCEEDED, ended_at=5.0)
    first = maps.wire(done)
    assert first["status"] == "SUCCEEDED" and first["ended_at"] == 5.0
    assert maps.wire(job(2, JobStatus.SUCCEEDED, ended_at=5.0)) is first


def test_a_job_id_again_on_a_new_cluster_or_a_changed_record_is_not_mistaken() -> None:
    maps = FinishedJobs()
    old = maps.wire(job(1, JobStatus.FAILED, ended_at=5.0, task_id="sky-a_c_1"))
    # The same cluster name launched anew: job 1 again, another task id.
    new = maps.wire(job(1, JobStatus.SUCCEEDED, ended_at=9.0, task_id="sky-b_c_1"))
    assert (old["status"], new["status"]) == ("FAILED", "SUCCEEDED")
    # Whatever changed a finished record (its end, its status) is seen.
    again = maps.wire(job(1, JobStatus.CANCELLED, ended_at=9.0, task_id="sky-b_c_1"))
    assert again["status"] == "CANCELLED"
    later = maps.wire(job(1, JobStatus.CANCELLED, ended_at=10.0, task_id="sky-b_c_1"))
    assert later["ended_at"] == 10.0


def test_the_maps_are_bounded() -> None:
    maps = FinishedJobs()
    maps.LIMIT = 10
    for index in range(25):
        maps.wire(job(index + 1, JobStatus.SUCCEEDED, ended_at=1.0))
    assert len(maps._maps) <= 10
