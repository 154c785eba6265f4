"""The mapping of job statuses to and from the agent's protobuf enum: the agent's, and its
client's in the daemon (the revision and metadata keys are in node_shared/wire.py). Imports
no Ray, so the daemon's agent client can use it cheaply."""

from __future__ import annotations

from clusterctl.protocol import JobStatus
from clusterd.agent.v1 import agent_pb2 as pb

# Looked up, not worked out by name each time: a queue of thousands of jobs converts each.
_TO_PB: dict[JobStatus, pb.JobStatus] = {
    status: pb.JobStatus.Value(f"JOB_STATUS_{status.value}") for status in JobStatus
}
_FROM_PB: dict[int, JobStatus] = {value: status for status, value in _TO_PB.items()}


def status_to_pb(status: JobStatus) -> pb.JobStatus:
    return _TO_PB[status]


def status_from_pb(value: pb.JobStatus) -> JobStatus:
    try:
        return _FROM_PB[value]
    except KeyError:
        raise ValueError(f"unknown job status {value}") from None
