"""The node helper's commands (`python -m clusterd.agent.node COMMAND -`), one typed request and
reply each: the daemon (runtime/node_helper.py) sends `request.to_dict()` as JSON on stdin,
the helper (agent/node.py) reads it back with `from_dict`, answers with a reply the daemon reads
the same way. One definition for both ends, so a field is renamed in one place.

A request names its command and its reply type (`class X(Request[XReply], command=...,
reply=XReply)`). Keys a side does not know are ignored (as the bare dicts were); a required
field missing is a BadRequest naming it. Secrets (tokens) are fields with `repr=False`: a
request's repr may end up in a log. Runs on nodes: Python 3.10 code, standard library only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, ClassVar, Generic, TypeVar, cast

M = TypeVar("M", bound="Message")
R = TypeVar("R", bound="Message")


class BadRequest(ValueError):
    """What came is not the message it should be (not an object, or a field missing)."""


@dataclasses.dataclass(frozen=True)
class Message:
    """A JSON object of known fields."""

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls: type[M], data: Mapping[str, Any]) -> M:
        if not isinstance(data, Mapping):
            raise BadRequest(f"{cls.__name__}: expected a JSON object, not {data!r:.80}")
        fields = {field.name: field for field in dataclasses.fields(cls)}
        missing = sorted(name for name, field in fields.items()
                         if name not in data and field.default is dataclasses.MISSING
                         and field.default_factory is dataclasses.MISSING)
        if missing:
            raise BadRequest(f"{cls.__name__}: missing {', '.join(missing)}")
        return cls(**cls._nested({key: value for key, value in data.items() if key in fields}))

    @classmethod
    def _nested(cls, values: dict[str, Any]) -> dict[str, Any]:
        """Read fields that are messages themselves (a subclass with such fields says how)."""
        return values


@dataclasses.dataclass(frozen=True)
class Request(Message, Generic[R]):
    """A command's parameters; `read_reply` reads its answer as the command's reply type."""

    command: ClassVar[str]
    reply_type: ClassVar[type[Message]]

    def __init_subclass__(cls, *, command: str = "", reply: type[Message] | None = None,
                          **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if command:
            assert reply is not None, f"{cls.__name__} names no reply type"
            cls.command, cls.reply_type = command, reply

    def read_reply(self, data: Mapping[str, Any]) -> R:
        return cast(R, self.reply_type.from_dict(data))


# -- runtime: Ray and the agent -----------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ProcessState(Message):
    alive: bool
    pid: int | None
    address: str | None = None  # a Ray head's `IP:PORT`, from its own command line


@dataclasses.dataclass(frozen=True)
class StatusReply(Message):
    ray: ProcessState
    agent: ProcessState
    # Left by an agent that stopped its cluster on its own: reason, down, at.
    autostopped: dict[str, Any] | None = None

    @classmethod
    def _nested(cls, values: dict[str, Any]) -> dict[str, Any]:
        return {**values, "ray": ProcessState.from_dict(values["ray"]),
                "agent": ProcessState.from_dict(values["agent"])}


@dataclasses.dataclass(frozen=True)
class StatusRequest(Request[StatusReply], command="status", reply=StatusReply):
    dir: str  # the node's run dir


@dataclasses.dataclass(frozen=True)
class StopReply(Message):
    agent_stopped: bool | None = None  # None: not asked to
    ray_stopped: bool | None = None


@dataclasses.dataclass(frozen=True)
class StopRequest(Request[StopReply], command="stop", reply=StopReply):
    """Stop the agent, then Ray (or only the `parts` named)."""

    dir: str
    parts: list[str] = dataclasses.field(default_factory=lambda: ["agent", "ray"])
    agent_grace: float = 25.0
    ray_grace: float = 10.0


@dataclasses.dataclass(frozen=True)
class StartRayReply(Message):
    started: bool  # False: it ran already
    pid: int
    remounted: list[str] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class StartRayRequest(Request[StartRayReply], command="start-ray", reply=StartRayReply):
    dir: str
    temp_key: str
    head: bool
    node_ip: str
    num_cpus: float
    object_store_bytes: int
    num_gpus: float = 0.0
    mark: str = ""  # a directory to mark as ours, so `down` may remove it whole
    token: str = dataclasses.field(default="", repr=False)  # Ray's, written to token_path
    token_path: str = ""
    resources: dict[str, float] | None = None
    ports: dict[str, int] = dataclasses.field(default_factory=dict)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: float = 60.0
    gcs_port: int | None = None  # the head's
    head_address: str = ""  # a worker's: the head's `IP:PORT`


@dataclasses.dataclass(frozen=True)
class StartAgentReply(Message):
    started: bool  # False: it ran already, with this token
    pid: int
    socket: str


@dataclasses.dataclass(frozen=True)
class StartAgentRequest(Request[StartAgentReply], command="start-agent",
                        reply=StartAgentReply):
    dir: str
    listen: str  # unix:PATH
    state_dir: str
    ray_address: str
    cluster_name: str
    # None: the one in the run dir's token file (a restart by hand).
    token: str | None = dataclasses.field(default=None, repr=False)
    log_level: str = "info"
    node_run_dir: str = ""
    autostop_grace: float = 300.0
    job_retention: int = 1000
    nonce_ttl: float | None = None
    shutdown_nodes: bool = False
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    timeout: float = 90.0
    agent_grace: float = 25.0


@dataclasses.dataclass(frozen=True)
class PathReply(Message):
    path: str


@dataclasses.dataclass(frozen=True)
class WritePrivateRequest(Request[PathReply], command="write-private", reply=PathReply):
    """A small secret file, mode 0600 (Ray's token, AWS credentials)."""

    path: str
    token: str = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class ReadTokenReply(Message):
    token: str = dataclasses.field(repr=False)


@dataclasses.dataclass(frozen=True)
class ReadTokenRequest(Request[ReadTokenReply], command="read-token", reply=ReadTokenReply):
    path: str


@dataclasses.dataclass(frozen=True)
class CleanupReply(Message):
    removed: list[str]


@dataclasses.dataclass(frozen=True)
class CleanupRequest(Request[CleanupReply], command="cleanup", reply=CleanupReply):
    """Remove runtime directories, only ones the helper made unless `force`."""

    paths: list[str] = dataclasses.field(default_factory=list)
    ray_temp_keys: list[str] = dataclasses.field(default_factory=list)
    force: bool = False


@dataclasses.dataclass(frozen=True)
class FreePortsReply(Message):
    ports: list[int]


@dataclasses.dataclass(frozen=True)
class FreePortsRequest(Request[FreePortsReply], command="free-ports", reply=FreePortsReply):
    count: int
    host: str = ""


# -- what jobs need -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ContainerRuntimeReply(Message):
    runtime: str | None  # the path of the first that answers
    why: str  # when none does


@dataclasses.dataclass(frozen=True)
class ContainerRuntimeRequest(Request[ContainerRuntimeReply], command="container-runtime",
                              reply=ContainerRuntimeReply):
    pass


@dataclasses.dataclass(frozen=True)
class GitCheckoutReply(Message):
    commit: str
    credentials_sent_to: str | None  # the origin a token or URL credentials went to


@dataclasses.dataclass(frozen=True)
class GitCheckoutRequest(Request[GitCheckoutReply], command="git-checkout",
                         reply=GitCheckoutReply):
    url: str
    dest: str
    ref: str | None = None  # None: HEAD
    token: str | None = dataclasses.field(default=None, repr=False)  # GIT_TOKEN
    timeout: float = 600.0


# -- buckets: COPY and mounts (agent/bucket_copy.py, agent/bucket_mount.py) --------------------


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketObjects(Message):
    """What every bucket command on a node reads: which objects (s3://bucket/prefix), where
    they go on the node, and how the node reaches S3. Its fields sit flat in each request's
    JSON object, as the plain objects that came before had them."""

    bucket: str
    dest: str  # a path on the node (`~` is its home)
    prefix: str = ""  # "" is the whole bucket
    region: str | None = None
    endpoint_url: str | None = None  # None: AWS's own
    # A credentials file the daemon wrote for this cluster; None: the node's own (an instance
    # profile). A path, not a secret: the keys themselves go by WritePrivateRequest.
    credentials_file: str | None = None


@dataclasses.dataclass(frozen=True)
class BucketCopyReply(Message):
    objects: int  # fetched
    bytes: int
    skipped: int  # already whole on the node


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketCopyRequest(BucketObjects, Request[BucketCopyReply], command="s3-copy",
                        reply=BucketCopyReply):
    """COPY s3://bucket/prefix to dest (a directory, or a file when the prefix is one key)."""


@dataclasses.dataclass(frozen=True)
class BucketMountReply(Message):
    dest: str
    already: bool  # mounted before, as asked: left as it is


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketMountRequest(BucketObjects, Request[BucketMountReply], command="s3-mount",
                         reply=BucketMountReply):
    """MOUNT or MOUNT_CACHED s3://bucket/prefix on dest (an empty directory), by rclone."""

    mode: str  # MOUNT or MOUNT_CACHED
    state: str  # the node's mounts directory: their records, caches and logs
    rclone: str | None = None  # one the daemon sent; None: the node's own


@dataclasses.dataclass(frozen=True)
class RcloneReply(Message):
    path: str | None  # the rclone a mount would run; None: none usable here
    found: str | None  # the version of one too old, when none is usable
    machine: str  # the node's (uname -m): which build to send it


@dataclasses.dataclass(frozen=True)
class RcloneRequest(Request[RcloneReply], command="s3-rclone", reply=RcloneReply):
    """Which rclone a mount would use: the one sent (`rclone`), else the node's if recent."""

    rclone: str | None = None


@dataclasses.dataclass(frozen=True)
class BucketFlushReply(Message):
    flushed: list[str]  # the mount points


@dataclasses.dataclass(frozen=True)
class BucketFlushRequest(Request[BucketFlushReply], command="s3-flush",
                         reply=BucketFlushReply):
    """Wait until every mount has uploaded what was written to it."""

    state: str
    timeout: float = 3600.0
    # Uploads queued with none in progress this long are failing: said, not waited out.
    stalled_grace: float = 60.0


@dataclasses.dataclass(frozen=True)
class BucketUnmountReply(Message):
    unmounted: list[str]


@dataclasses.dataclass(frozen=True)
class BucketUnmountRequest(Request[BucketUnmountReply], command="s3-unmount",
                           reply=BucketUnmountReply):
    """Unmount every mount (each flushed first, bounded) and stop its rclone."""

    state: str
    keep: bool = False  # keep the records: a stopped node's start mounts them again
    flush_timeout: float = 300.0
    stalled_grace: float = 20.0


TYPED_REQUESTS: tuple[type[Request[Any]], ...] = (
    StatusRequest, StopRequest, StartRayRequest, StartAgentRequest, WritePrivateRequest,
    ReadTokenRequest, CleanupRequest, FreePortsRequest, ContainerRuntimeRequest,
    GitCheckoutRequest, BucketCopyRequest, BucketMountRequest, RcloneRequest,
    BucketFlushRequest, BucketUnmountRequest,
)
