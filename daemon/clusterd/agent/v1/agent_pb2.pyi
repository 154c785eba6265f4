from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class JobStatus(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    JOB_STATUS_UNSPECIFIED: _ClassVar[JobStatus]
    JOB_STATUS_INIT: _ClassVar[JobStatus]
    JOB_STATUS_PENDING: _ClassVar[JobStatus]
    JOB_STATUS_SETTING_UP: _ClassVar[JobStatus]
    JOB_STATUS_RUNNING: _ClassVar[JobStatus]
    JOB_STATUS_SUCCEEDED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED: _ClassVar[JobStatus]
    JOB_STATUS_FAILED_SETUP: _ClassVar[JobStatus]
    JOB_STATUS_FAILED_DRIVER: _ClassVar[JobStatus]
    JOB_STATUS_CANCELLED: _ClassVar[JobStatus]

class WaitFor(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    WAIT_FOR_UNSPECIFIED: _ClassVar[WaitFor]
    WAIT_FOR_JOBS_AND_SSH: _ClassVar[WaitFor]
    WAIT_FOR_JOBS: _ClassVar[WaitFor]
    WAIT_FOR_NONE: _ClassVar[WaitFor]
JOB_STATUS_UNSPECIFIED: JobStatus
JOB_STATUS_INIT: JobStatus
JOB_STATUS_PENDING: JobStatus
JOB_STATUS_SETTING_UP: JobStatus
JOB_STATUS_RUNNING: JobStatus
JOB_STATUS_SUCCEEDED: JobStatus
JOB_STATUS_FAILED: JobStatus
JOB_STATUS_FAILED_SETUP: JobStatus
JOB_STATUS_FAILED_DRIVER: JobStatus
JOB_STATUS_CANCELLED: JobStatus
WAIT_FOR_UNSPECIFIED: WaitFor
WAIT_FOR_JOBS_AND_SSH: WaitFor
WAIT_FOR_JOBS: WaitFor
WAIT_FOR_NONE: WaitFor

class NodeResources(_message.Message):
    __slots__ = ("cpus", "gpus", "memory_gb", "accelerator")
    CPUS_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    MEMORY_GB_FIELD_NUMBER: _ClassVar[int]
    ACCELERATOR_FIELD_NUMBER: _ClassVar[int]
    cpus: float
    gpus: float
    memory_gb: float
    accelerator: str
    def __init__(self, cpus: _Optional[float] = ..., gpus: _Optional[float] = ..., memory_gb: _Optional[float] = ..., accelerator: _Optional[str] = ...) -> None: ...

class JobSpec(_message.Message):
    __slots__ = ("name", "setup", "run", "envs", "secrets", "num_nodes", "resources", "workdir", "user", "cluster_name", "resources_display", "container_image", "cloud", "region", "zone", "task_id")
    class EnvsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    class SecretsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    SETUP_FIELD_NUMBER: _ClassVar[int]
    RUN_FIELD_NUMBER: _ClassVar[int]
    ENVS_FIELD_NUMBER: _ClassVar[int]
    SECRETS_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    WORKDIR_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_NAME_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_DISPLAY_FIELD_NUMBER: _ClassVar[int]
    CONTAINER_IMAGE_FIELD_NUMBER: _ClassVar[int]
    CLOUD_FIELD_NUMBER: _ClassVar[int]
    REGION_FIELD_NUMBER: _ClassVar[int]
    ZONE_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    setup: str
    run: str
    envs: _containers.ScalarMap[str, str]
    secrets: _containers.ScalarMap[str, str]
    num_nodes: int
    resources: NodeResources
    workdir: str
    user: str
    cluster_name: str
    resources_display: str
    container_image: str
    cloud: str
    region: str
    zone: str
    task_id: str
    def __init__(self, name: _Optional[str] = ..., setup: _Optional[str] = ..., run: _Optional[str] = ..., envs: _Optional[_Mapping[str, str]] = ..., secrets: _Optional[_Mapping[str, str]] = ..., num_nodes: _Optional[int] = ..., resources: _Optional[_Union[NodeResources, _Mapping]] = ..., workdir: _Optional[str] = ..., user: _Optional[str] = ..., cluster_name: _Optional[str] = ..., resources_display: _Optional[str] = ..., container_image: _Optional[str] = ..., cloud: _Optional[str] = ..., region: _Optional[str] = ..., zone: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class AddJobRequest(_message.Message):
    __slots__ = ("spec",)
    SPEC_FIELD_NUMBER: _ClassVar[int]
    spec: JobSpec
    def __init__(self, spec: _Optional[_Union[JobSpec, _Mapping]] = ...) -> None: ...

class AddJobResponse(_message.Message):
    __slots__ = ("job_id", "log_dir", "task_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    LOG_DIR_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    log_dir: str
    task_id: str
    def __init__(self, job_id: _Optional[int] = ..., log_dir: _Optional[str] = ..., task_id: _Optional[str] = ...) -> None: ...

class Job(_message.Message):
    __slots__ = ("job_id", "name", "user", "status", "submitted_at", "started_at", "ended_at", "resources_display", "num_nodes", "log_dir", "failure_reason", "exit_codes", "task_id")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    USER_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    SUBMITTED_AT_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    ENDED_AT_FIELD_NUMBER: _ClassVar[int]
    RESOURCES_DISPLAY_FIELD_NUMBER: _ClassVar[int]
    NUM_NODES_FIELD_NUMBER: _ClassVar[int]
    LOG_DIR_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    EXIT_CODES_FIELD_NUMBER: _ClassVar[int]
    TASK_ID_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    name: str
    user: str
    status: JobStatus
    submitted_at: float
    started_at: float
    ended_at: float
    resources_display: str
    num_nodes: int
    log_dir: str
    failure_reason: str
    exit_codes: _containers.RepeatedScalarFieldContainer[int]
    task_id: str
    def __init__(self, job_id: _Optional[int] = ..., name: _Optional[str] = ..., user: _Optional[str] = ..., status: _Optional[_Union[JobStatus, str]] = ..., submitted_at: _Optional[float] = ..., started_at: _Optional[float] = ..., ended_at: _Optional[float] = ..., resources_display: _Optional[str] = ..., num_nodes: _Optional[int] = ..., log_dir: _Optional[str] = ..., failure_reason: _Optional[str] = ..., exit_codes: _Optional[_Iterable[int]] = ..., task_id: _Optional[str] = ...) -> None: ...

class GetJobQueueRequest(_message.Message):
    __slots__ = ("skip_finished",)
    SKIP_FINISHED_FIELD_NUMBER: _ClassVar[int]
    skip_finished: bool
    def __init__(self, skip_finished: _Optional[bool] = ...) -> None: ...

class GetJobQueueResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class GetJobStatusRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetJobStatusResponse(_message.Message):
    __slots__ = ("jobs",)
    JOBS_FIELD_NUMBER: _ClassVar[int]
    jobs: _containers.RepeatedCompositeFieldContainer[Job]
    def __init__(self, jobs: _Optional[_Iterable[_Union[Job, _Mapping]]] = ...) -> None: ...

class CancelJobsRequest(_message.Message):
    __slots__ = ("job_ids", "all")
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    ALL_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    all: bool
    def __init__(self, job_ids: _Optional[_Iterable[int]] = ..., all: _Optional[bool] = ...) -> None: ...

class CancelJobsResponse(_message.Message):
    __slots__ = ("cancelled_job_ids",)
    CANCELLED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    cancelled_job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, cancelled_job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class TailLogsRequest(_message.Message):
    __slots__ = ("job_id", "follow", "tail_lines", "start_offset")
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FOLLOW_FIELD_NUMBER: _ClassVar[int]
    TAIL_LINES_FIELD_NUMBER: _ClassVar[int]
    START_OFFSET_FIELD_NUMBER: _ClassVar[int]
    job_id: int
    follow: bool
    tail_lines: int
    start_offset: int
    def __init__(self, job_id: _Optional[int] = ..., follow: _Optional[bool] = ..., tail_lines: _Optional[int] = ..., start_offset: _Optional[int] = ...) -> None: ...

class TailLogsResponse(_message.Message):
    __slots__ = ("data", "offset", "final", "status", "job_id", "failure_reason")
    DATA_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    FINAL_FIELD_NUMBER: _ClassVar[int]
    STATUS_FIELD_NUMBER: _ClassVar[int]
    JOB_ID_FIELD_NUMBER: _ClassVar[int]
    FAILURE_REASON_FIELD_NUMBER: _ClassVar[int]
    data: bytes
    offset: int
    final: bool
    status: JobStatus
    job_id: int
    failure_reason: str
    def __init__(self, data: _Optional[bytes] = ..., offset: _Optional[int] = ..., final: _Optional[bool] = ..., status: _Optional[_Union[JobStatus, str]] = ..., job_id: _Optional[int] = ..., failure_reason: _Optional[str] = ...) -> None: ...

class GetLogDirsRequest(_message.Message):
    __slots__ = ("job_ids",)
    JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class GetLogDirsResponse(_message.Message):
    __slots__ = ("log_dirs",)
    class LogDirsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: int
        value: str
        def __init__(self, key: _Optional[int] = ..., value: _Optional[str] = ...) -> None: ...
    LOG_DIRS_FIELD_NUMBER: _ClassVar[int]
    log_dirs: _containers.ScalarMap[int, str]
    def __init__(self, log_dirs: _Optional[_Mapping[int, str]] = ...) -> None: ...

class FailInProgressJobsRequest(_message.Message):
    __slots__ = ("reason",)
    REASON_FIELD_NUMBER: _ClassVar[int]
    reason: str
    def __init__(self, reason: _Optional[str] = ...) -> None: ...

class FailInProgressJobsResponse(_message.Message):
    __slots__ = ("failed_job_ids",)
    FAILED_JOB_IDS_FIELD_NUMBER: _ClassVar[int]
    failed_job_ids: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, failed_job_ids: _Optional[_Iterable[int]] = ...) -> None: ...

class SetAutostopRequest(_message.Message):
    __slots__ = ("idle_minutes", "down", "wait_for")
    IDLE_MINUTES_FIELD_NUMBER: _ClassVar[int]
    DOWN_FIELD_NUMBER: _ClassVar[int]
    WAIT_FOR_FIELD_NUMBER: _ClassVar[int]
    idle_minutes: float
    down: bool
    wait_for: WaitFor
    def __init__(self, idle_minutes: _Optional[float] = ..., down: _Optional[bool] = ..., wait_for: _Optional[_Union[WaitFor, str]] = ...) -> None: ...

class SetAutostopResponse(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsAutostoppingRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class IsAutostoppingResponse(_message.Message):
    __slots__ = ("is_autostopping",)
    IS_AUTOSTOPPING_FIELD_NUMBER: _ClassVar[int]
    is_autostopping: bool
    def __init__(self, is_autostopping: _Optional[bool] = ...) -> None: ...

class GetIdleInfoRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetIdleInfoResponse(_message.Message):
    __slots__ = ("idle_since", "active_jobs", "ssh_sessions", "autostop_idle_minutes", "autostop_down", "autostop_wait_for", "autostop_set_at")
    IDLE_SINCE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_JOBS_FIELD_NUMBER: _ClassVar[int]
    SSH_SESSIONS_FIELD_NUMBER: _ClassVar[int]
    AUTOSTOP_IDLE_MINUTES_FIELD_NUMBER: _ClassVar[int]
    AUTOSTOP_DOWN_FIELD_NUMBER: _ClassVar[int]
    AUTOSTOP_WAIT_FOR_FIELD_NUMBER: _ClassVar[int]
    AUTOSTOP_SET_AT_FIELD_NUMBER: _ClassVar[int]
    idle_since: float
    active_jobs: int
    ssh_sessions: int
    autostop_idle_minutes: float
    autostop_down: bool
    autostop_wait_for: WaitFor
    autostop_set_at: float
    def __init__(self, idle_since: _Optional[float] = ..., active_jobs: _Optional[int] = ..., ssh_sessions: _Optional[int] = ..., autostop_idle_minutes: _Optional[float] = ..., autostop_down: _Optional[bool] = ..., autostop_wait_for: _Optional[_Union[WaitFor, str]] = ..., autostop_set_at: _Optional[float] = ...) -> None: ...

class GetHealthRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class GetHealthResponse(_message.Message):
    __slots__ = ("version", "protocol", "ray_connected", "ray_nodes_alive", "started_at", "pid", "ray_node_ips")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    RAY_CONNECTED_FIELD_NUMBER: _ClassVar[int]
    RAY_NODES_ALIVE_FIELD_NUMBER: _ClassVar[int]
    STARTED_AT_FIELD_NUMBER: _ClassVar[int]
    PID_FIELD_NUMBER: _ClassVar[int]
    RAY_NODE_IPS_FIELD_NUMBER: _ClassVar[int]
    version: str
    protocol: int
    ray_connected: bool
    ray_nodes_alive: int
    started_at: float
    pid: int
    ray_node_ips: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, version: _Optional[str] = ..., protocol: _Optional[int] = ..., ray_connected: _Optional[bool] = ..., ray_nodes_alive: _Optional[int] = ..., started_at: _Optional[float] = ..., pid: _Optional[int] = ..., ray_node_ips: _Optional[_Iterable[str]] = ...) -> None: ...

class HandshakeRequest(_message.Message):
    __slots__ = ("client_nonce",)
    CLIENT_NONCE_FIELD_NUMBER: _ClassVar[int]
    client_nonce: bytes
    def __init__(self, client_nonce: _Optional[bytes] = ...) -> None: ...

class HandshakeResponse(_message.Message):
    __slots__ = ("server_nonce", "proof", "version", "protocol")
    SERVER_NONCE_FIELD_NUMBER: _ClassVar[int]
    PROOF_FIELD_NUMBER: _ClassVar[int]
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_FIELD_NUMBER: _ClassVar[int]
    server_nonce: bytes
    proof: bytes
    version: str
    protocol: int
    def __init__(self, server_nonce: _Optional[bytes] = ..., proof: _Optional[bytes] = ..., version: _Optional[str] = ..., protocol: _Optional[int] = ...) -> None: ...

class IssueNoncesRequest(_message.Message):
    __slots__ = ("count",)
    COUNT_FIELD_NUMBER: _ClassVar[int]
    count: int
    def __init__(self, count: _Optional[int] = ...) -> None: ...

class IssueNoncesResponse(_message.Message):
    __slots__ = ("nonces", "ttl_s")
    NONCES_FIELD_NUMBER: _ClassVar[int]
    TTL_S_FIELD_NUMBER: _ClassVar[int]
    nonces: _containers.RepeatedScalarFieldContainer[bytes]
    ttl_s: float
    def __init__(self, nonces: _Optional[_Iterable[bytes]] = ..., ttl_s: _Optional[float] = ...) -> None: ...

class GpuUse(_message.Message):
    __slots__ = ("util_percent", "memory_used_bytes", "memory_total_bytes")
    UTIL_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    util_percent: float
    memory_used_bytes: float
    memory_total_bytes: float
    def __init__(self, util_percent: _Optional[float] = ..., memory_used_bytes: _Optional[float] = ..., memory_total_bytes: _Optional[float] = ...) -> None: ...

class UsageSample(_message.Message):
    __slots__ = ("ts", "cpu_percent", "memory_used_bytes", "memory_total_bytes", "gpus")
    TS_FIELD_NUMBER: _ClassVar[int]
    CPU_PERCENT_FIELD_NUMBER: _ClassVar[int]
    MEMORY_USED_BYTES_FIELD_NUMBER: _ClassVar[int]
    MEMORY_TOTAL_BYTES_FIELD_NUMBER: _ClassVar[int]
    GPUS_FIELD_NUMBER: _ClassVar[int]
    ts: float
    cpu_percent: float
    memory_used_bytes: float
    memory_total_bytes: float
    gpus: _containers.RepeatedCompositeFieldContainer[GpuUse]
    def __init__(self, ts: _Optional[float] = ..., cpu_percent: _Optional[float] = ..., memory_used_bytes: _Optional[float] = ..., memory_total_bytes: _Optional[float] = ..., gpus: _Optional[_Iterable[_Union[GpuUse, _Mapping]]] = ...) -> None: ...

class NodeUsage(_message.Message):
    __slots__ = ("node_id", "ip", "head", "samples")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    IP_FIELD_NUMBER: _ClassVar[int]
    HEAD_FIELD_NUMBER: _ClassVar[int]
    SAMPLES_FIELD_NUMBER: _ClassVar[int]
    node_id: str
    ip: str
    head: bool
    samples: _containers.RepeatedCompositeFieldContainer[UsageSample]
    def __init__(self, node_id: _Optional[str] = ..., ip: _Optional[str] = ..., head: _Optional[bool] = ..., samples: _Optional[_Iterable[_Union[UsageSample, _Mapping]]] = ...) -> None: ...

class GetNodeUsageRequest(_message.Message):
    __slots__ = ("since",)
    SINCE_FIELD_NUMBER: _ClassVar[int]
    since: float
    def __init__(self, since: _Optional[float] = ...) -> None: ...

class GetNodeUsageResponse(_message.Message):
    __slots__ = ("nodes", "interval_s")
    NODES_FIELD_NUMBER: _ClassVar[int]
    INTERVAL_S_FIELD_NUMBER: _ClassVar[int]
    nodes: _containers.RepeatedCompositeFieldContainer[NodeUsage]
    interval_s: float
    def __init__(self, nodes: _Optional[_Iterable[_Union[NodeUsage, _Mapping]]] = ..., interval_s: _Optional[float] = ...) -> None: ...
