"""What the daemon sends to and reads from a cluster's agent, as typed values.

Services speak these; the agent client (agent_client.py) alone turns them into the gRPC
messages of `protos/` and back, so no service builds or reads a protobuf message, and the wire
can change shape without any of them knowing. Each type mirrors its message in
`agent.proto` (the comments there say what each field means), with "not set" as None where
the message uses 0 or "".
"""

from __future__ import annotations

import dataclasses
from typing import Literal, get_args

from clusterctl.protocol import JobStatus

WaitFor = Literal["jobs_and_ssh", "jobs", "none"]


def as_wait_for(value: str) -> WaitFor:
    """`value` as a WaitFor; ValueError if it names none (the control socket checks it)."""
    for choice in get_args(WaitFor):
        if value == choice:
            return choice  # type: ignore[no-any-return]
    raise ValueError(f"wait_for must be one of {', '.join(get_args(WaitFor))}, not {value!r}")


@dataclasses.dataclass(frozen=True, slots=True)
class NodeResources:
    """What each node of a job takes from the cluster's."""

    cpus: float = 0.0
    gpus: float = 0.0
    memory_gb: float = 0.0  # 0: not asked for
    accelerator: str = ""  # e.g. "A100"; "": none


@dataclasses.dataclass(frozen=True, slots=True)
class JobSpec:
    """A job to queue: its scripts and what it runs on, by value (never generated code)."""

    run: str
    name: str = ""
    setup: str = ""  # "": no setup
    envs: dict[str, str] = dataclasses.field(default_factory=dict)
    # Never shown (a repr ends up in logs and tracebacks): the agent keeps them in memory only.
    secrets: dict[str, str] = dataclasses.field(default_factory=dict, repr=False)
    num_nodes: int = 1
    resources: NodeResources = dataclasses.field(default_factory=NodeResources)
    workdir: str = ""  # "": the home directory
    user: str = ""
    cluster_name: str = ""
    resources_display: str = ""
    container_image: str = ""  # "": on the node itself
    cloud: str = ""
    region: str = ""
    zone: str = ""
    task_id: str = ""


@dataclasses.dataclass(frozen=True, slots=True)
class SubmittedJob:
    job_id: int
    log_dir: str
    task_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class Job:
    """A job in the agent's queue."""

    job_id: int
    name: str
    user: str
    status: JobStatus
    submitted_at: float  # Unix seconds
    started_at: float | None
    ended_at: float | None
    resources_display: str
    num_nodes: int
    log_dir: str
    failure_reason: str
    exit_codes: tuple[int, ...]  # per rank, once known
    task_id: str


@dataclasses.dataclass(frozen=True, slots=True)
class LogChunk:
    """One message of a log stream: bytes of the job's log, or (`final`) how it ended."""

    job_id: int
    data: bytes
    offset: int  # just past this chunk: where a resumed stream starts
    final: bool
    status: JobStatus | None  # on the final message
    failure_reason: str


@dataclasses.dataclass(frozen=True, slots=True)
class AutostopSetting:
    """What the agent enforces on its own: `idle_minutes` None cancels autostop."""

    idle_minutes: float | None
    down: bool = False
    wait_for: WaitFor = "jobs_and_ssh"


@dataclasses.dataclass(frozen=True, slots=True)
class IdleInfo:
    idle_since: float | None  # Unix seconds; None: busy now
    active_jobs: int
    ssh_sessions: int


@dataclasses.dataclass(frozen=True, slots=True)
class Health:
    version: str
    protocol: int
    ray_connected: bool
    ray_nodes_alive: int
    started_at: float
    pid: int
    ray_node_ips: tuple[str, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class GpuUse:
    util_percent: float
    memory_used_bytes: float
    memory_total_bytes: float


@dataclasses.dataclass(frozen=True, slots=True)
class UsageSample:
    ts: float  # Unix seconds
    cpu_percent: float | None  # None: unknown
    memory_used_bytes: float
    memory_total_bytes: float
    gpus: tuple[GpuUse, ...]


@dataclasses.dataclass(frozen=True, slots=True)
class NodeUsage:
    """A node's recent samples, oldest first."""

    node_id: str
    ip: str
    head: bool
    samples: tuple[UsageSample, ...]
