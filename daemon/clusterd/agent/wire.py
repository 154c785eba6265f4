"""What both ends of the agent's gRPC API agree on beyond the protos: the API revision and
the mapping of job statuses. Imports no Ray, so the daemon can use it cheaply."""

from __future__ import annotations

from clusterctl.protocol import JobStatus
from clusterd.agent.v1 import agent_pb2 as pb

# Bumped when the agent's API changes incompatibly; the daemon checks it at connect time.
# 2: a Unix socket only, a token, and the Handshake call.
# 3: credentials over nonces the agent issues (IssueNonces), each good for one call.
AGENT_PROTOCOL = 3
# gRPC metadata key carrying the daemon's request id into the agent's log lines.
REQUEST_ID_METADATA = "x-clusterd-request-id"
# The caller's version: an agent of another version refuses every call but GetHealth, so a
# restarted (or replaced) agent can never serve a daemon it does not match.
VERSION_METADATA = "x-clusterd-version"
VERSION_MISMATCH_PREFIX = "AGENT_VERSION_MISMATCH:"

WAIT_FOR_TO_PB = {
    "jobs_and_ssh": pb.WAIT_FOR_JOBS_AND_SSH,
    "jobs": pb.WAIT_FOR_JOBS,
    "none": pb.WAIT_FOR_NONE,
}


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
