"""The agent client's conversions between the daemon's typed values (runtime/agent_types.py)
and the agent's protobuf messages: every field crosses, "not set" is None on our side."""

from __future__ import annotations

import dataclasses

import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.wire import status_to_pb
from clusterd.runtime.agent_client import (
    WAIT_FOR_TO_PB,
    FinishedJobCache,
    health_from_pb,
    job_from_pb,
    job_spec_to_pb,
    log_chunk_from_pb,
)
from clusterd.runtime.agent_types import JobSpec, NodeResources, WaitFor, as_wait_for


def test_every_field_of_a_job_spec_reaches_its_message() -> None:
    spec = JobSpec(
        run="echo hi", name="n", setup="make", envs={"A": "1"}, secrets={"S": "x"},
        num_nodes=2, resources=NodeResources(cpus=1.5, gpus=1, memory_gb=4, accelerator="T4"),
        workdir="/w", user="u", cluster_name="c", resources_display="2x[CPU:1.5]",
        container_image="ubuntu:22.04", cloud="aws", region="r", zone="z", task_id="t")
    message = job_spec_to_pb(spec)
    for field in dataclasses.fields(JobSpec):
        if field.name == "resources":
            continue
        value = getattr(message, field.name)
        assert (dict(value) if field.name in ("envs", "secrets") else value) == getattr(
            spec, field.name), field.name
    assert (message.resources.cpus, message.resources.gpus, message.resources.memory_gb,
            message.resources.accelerator) == (1.5, 1, 4, "T4")


def test_a_job_specs_secrets_never_show_in_its_repr() -> None:
    assert "hunter2" not in repr(JobSpec(run="true", secrets={"PASSWORD": "hunter2"}))


def test_a_job_comes_back_typed_with_unset_times_as_none() -> None:
    job = job_from_pb(pb.Job(job_id=3, status=status_to_pb(JobStatus.RUNNING),
                             submitted_at=1.0, started_at=2.0, exit_codes=[0, 1]))
    assert job.status is JobStatus.RUNNING
    assert (job.started_at, job.ended_at, job.exit_codes) == (2.0, None, (0, 1))


def test_only_a_final_log_message_carries_a_status() -> None:
    chunk = log_chunk_from_pb(pb.TailLogsResponse(data=b"x", offset=1, job_id=4))
    assert (chunk.data, chunk.offset, chunk.status, chunk.final) == (b"x", 1, None, False)
    final = log_chunk_from_pb(pb.TailLogsResponse(
        final=True, status=status_to_pb(JobStatus.FAILED), failure_reason="exit 1", job_id=4))
    assert (final.status, final.failure_reason) == (JobStatus.FAILED, "exit 1")


def test_health_crosses_whole() -> None:
    health = health_from_pb(pb.GetHealthResponse(version="1", protocol=3, ray_connected=True,
                                                 ray_nodes_alive=2, ray_node_ips=["a", "b"]))
    assert (health.ray_connected, health.ray_nodes_alive, health.ray_node_ips) == (
        True, 2, ("a", "b"))


@pytest.mark.parametrize("choice", ["jobs_and_ssh", "jobs", "none"])
def test_every_wait_for_has_its_message_value(choice: WaitFor) -> None:
    assert as_wait_for(choice) == choice
    assert pb.WaitFor.Name(WAIT_FOR_TO_PB[choice]) == f"WAIT_FOR_{choice.upper()}"


def test_an_unknown_wait_for_is_refused() -> None:
    with pytest.raises(ValueError, match="wait_for must be one of"):
        as_wait_for("ssh")


def test_a_finished_job_is_converted_once_and_a_changed_one_again() -> None:
    cache = FinishedJobCache()

    def listed(status: JobStatus, ended_at: float = 0.0, task_id: str = "t1") -> pb.Job:
        return pb.Job(job_id=1, status=status_to_pb(status), ended_at=ended_at, task_id=task_id)

    (running,) = cache.convert([listed(JobStatus.RUNNING)])
    assert cache.convert([listed(JobStatus.RUNNING)])[0] is not running
    (done,) = cache.convert([listed(JobStatus.SUCCEEDED, 5.0)])
    assert cache.convert([listed(JobStatus.SUCCEEDED, 5.0)])[0] is done
    (cancelled,) = cache.convert([listed(JobStatus.CANCELLED, 5.0)])
    assert cancelled.status is JobStatus.CANCELLED
    (later,) = cache.convert([listed(JobStatus.CANCELLED, 6.0)])
    assert later.ended_at == 6.0
    (other,) = cache.convert([listed(JobStatus.CANCELLED, 6.0, task_id="t2")])
    assert other is not later
