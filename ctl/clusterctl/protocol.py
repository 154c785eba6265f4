"""The clusterctl ⇄ clusterd wire protocol: its one definition.

Both the client and the daemon import this module; the daemon never defines a frame, an op or
an error code of its own. Standard library and msgpack only: clusterctl must start fast.

A frame is a 4-byte big-endian length followed by one msgpack map of that many bytes. The
message kinds, in order of appearance on a connection:

* ``hello`` (client → daemon, first frame): ``{"type": "hello", "protocol": 1, "client": str}``;
  the daemon answers with its own hello (``server``, ``protocol``, ``ops``) or an ``error``
  frame and closes.
* ``request``: ``{"type": "request", "id": int, "op": str, "args": map}``. Ids are chosen by
  the client, unique among its in-flight requests on that connection.
* ``event``: ``{"type": "event", "id": int, "event": str, "data": map}``: zero or more per
  request, for streaming ops (logs, progress).
* ``reply``: ``{"type": "reply", "id": int, "ok": true, "result": map}`` or
  ``{"type": "reply", "id": int, "ok": false, "error": {"code", "message", "hint"}}``; always
  the last frame for its id.
* ``cancel``: ``{"type": "cancel", "id": int}`` (client → daemon) stops a stream the client no
  longer wants; like closing the connection, it detaches and never kills the job.
* ``error``: a connection-level error not tied to one request (bad frame, wrong version);
  the daemon closes the connection after sending it.

``docs/protocol.md`` describes the same for people writing other clients.
"""

from __future__ import annotations

import enum
import struct
import types
import typing
from collections.abc import Iterator, Mapping
from typing import Any, ClassVar, TypeVar

import msgpack

# Re-exported: clients and the daemon know them as protocol.X.
from clusterctl._limits import MAX_FRAME_BYTES as MAX_FRAME_BYTES
from clusterctl._limits import REPLY_LIMITS as REPLY_LIMITS
from clusterctl._limits import REQUEST_LIMITS as REQUEST_LIMITS
from clusterctl._limits import DecodeLimits as DecodeLimits
from clusterctl._limits import TooManyItems, unpack

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")

HELLO = "hello"
REQUEST = "request"
REPLY = "reply"
EVENT = "event"
CANCEL = "cancel"
ERROR = "error"


class ErrorCode(enum.StrEnum):
    """Stable error codes. Clients branch on these, never on messages."""

    BAD_FRAME = "BAD_FRAME"
    FRAME_TOO_LARGE = "FRAME_TOO_LARGE"
    UNSUPPORTED_VERSION = "UNSUPPORTED_VERSION"
    HELLO_REQUIRED = "HELLO_REQUIRED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNKNOWN_OP = "UNKNOWN_OP"
    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    DUPLICATE_REQUEST_ID = "DUPLICATE_REQUEST_ID"
    INVALID_TASK = "INVALID_TASK"
    INVALID_NAME = "INVALID_NAME"
    CLUSTER_NOT_FOUND = "CLUSTER_NOT_FOUND"
    CLUSTER_NOT_UP = "CLUSTER_NOT_UP"
    CLUSTER_MISMATCH = "CLUSTER_MISMATCH"
    JOB_NOT_FOUND = "JOB_NOT_FOUND"
    MANAGED_JOB_NOT_FOUND = "MANAGED_JOB_NOT_FOUND"
    MANAGED_CLUSTER = "MANAGED_CLUSTER"
    RESOURCES_UNAVAILABLE = "RESOURCES_UNAVAILABLE"
    UNSUPPORTED = "UNSUPPORTED"
    LOCK_TIMEOUT = "LOCK_TIMEOUT"
    PREEMPTED = "PREEMPTED"
    PROVIDER_ERROR = "PROVIDER_ERROR"
    AGENT_UNREACHABLE = "AGENT_UNREACHABLE"
    AGENT_VERSION_MISMATCH = "AGENT_VERSION_MISMATCH"
    NODE_UNREACHABLE = "NODE_UNREACHABLE"
    HOST_KEY_MISMATCH = "HOST_KEY_MISMATCH"
    HOST_KEY_UNKNOWN = "HOST_KEY_UNKNOWN"
    SHUTTING_DOWN = "SHUTTING_DOWN"
    TOO_MANY_CONNECTIONS = "TOO_MANY_CONNECTIONS"
    IDLE_TIMEOUT = "IDLE_TIMEOUT"
    REQUEST_NOT_FOUND = "REQUEST_NOT_FOUND"
    INTERNAL = "INTERNAL"


NOT_FOUND_CODES = frozenset({ErrorCode.CLUSTER_NOT_FOUND, ErrorCode.JOB_NOT_FOUND,
                             ErrorCode.MANAGED_JOB_NOT_FOUND})


class JobStatus(enum.StrEnum):
    INIT = "INIT"
    PENDING = "PENDING"
    SETTING_UP = "SETTING_UP"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_DRIVER = "FAILED_DRIVER"
    CANCELLED = "CANCELLED"

    @property
    def is_terminal(self) -> bool:
        return self in _TERMINAL_JOB_STATUSES


_TERMINAL_JOB_STATUSES = frozenset(
    {
        JobStatus.SUCCEEDED,
        JobStatus.FAILED,
        JobStatus.FAILED_SETUP,
        JobStatus.FAILED_DRIVER,
        JobStatus.CANCELLED,
    }
)


class ClusterStatus(enum.StrEnum):
    INIT = "INIT"
    UP = "UP"
    STOPPED = "STOPPED"
    TERMINATED = "TERMINATED"  # only in events: the record has left the live table


class ManagedJobStatus(enum.StrEnum):
    """A managed job's status, with SkyPilot's names and meanings."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"
    CANCELLING = "CANCELLING"
    SUCCEEDED = "SUCCEEDED"
    CANCELLED = "CANCELLED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"
    FAILED_PRECHECKS = "FAILED_PRECHECKS"
    FAILED_NO_RESOURCE = "FAILED_NO_RESOURCE"
    FAILED_CONTROLLER = "FAILED_CONTROLLER"

    @property
    def is_final(self) -> bool:
        return self in _FINAL_MANAGED_STATUSES


_FINAL_MANAGED_STATUSES = frozenset(
    {
        ManagedJobStatus.SUCCEEDED,
        ManagedJobStatus.CANCELLED,
        ManagedJobStatus.FAILED,
        ManagedJobStatus.FAILED_SETUP,
        ManagedJobStatus.FAILED_PRECHECKS,
        ManagedJobStatus.FAILED_NO_RESOURCE,
        ManagedJobStatus.FAILED_CONTROLLER,
    }
)


class ExitCode(enum.IntEnum):
    """Exit codes of clusterctl, also carried in the final reply of job streams."""

    SUCCEEDED = 0
    ERROR = 1
    FAILED = 100
    NOT_FINISHED = 101
    NOT_FOUND = 102
    CANCELLED = 103


def exit_code_for_job(status: JobStatus | str | None) -> ExitCode:
    if status is None:
        return ExitCode.NOT_FINISHED
    status = JobStatus(status)
    if status == JobStatus.SUCCEEDED:
        return ExitCode.SUCCEEDED
    if status == JobStatus.CANCELLED:
        return ExitCode.CANCELLED
    if status.is_terminal:
        return ExitCode.FAILED
    return ExitCode.NOT_FINISHED


def exit_code_for_managed_job(status: ManagedJobStatus | str | None) -> ExitCode:
    if status is None or not ManagedJobStatus(status).is_final:
        return ExitCode.NOT_FINISHED
    status = ManagedJobStatus(status)
    if status == ManagedJobStatus.SUCCEEDED:
        return ExitCode.SUCCEEDED
    if status == ManagedJobStatus.CANCELLED:
        return ExitCode.CANCELLED
    return ExitCode.FAILED


# --------------------------------------------------------------------------------------------
# Framing


class ProtocolError(Exception):
    """A frame or message that breaks the protocol. Carries the code sent back to the peer."""

    def __init__(self, code: ErrorCode, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint

    def to_wire(self) -> dict[str, str]:
        return {"code": str(self.code), "message": self.message, "hint": self.hint}


def encode_frame(message: Mapping[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise ProtocolError(
            ErrorCode.FRAME_TOO_LARGE,
            f"frame of {len(body)} bytes exceeds the limit of {MAX_FRAME_BYTES}",
        )
    return HEADER.pack(len(body)) + body


class FrameDecoder:
    """Incremental decoder: feed bytes as they arrive, get whole messages out.

    Raises ProtocolError for a declared length over the limit (before buffering the body) and
    for a body that is not one msgpack map within `limits`.
    """

    def __init__(self, max_frame_bytes: int = MAX_FRAME_BYTES,
                 limits: DecodeLimits = REPLY_LIMITS) -> None:
        self._buffer = bytearray()
        self._max = max_frame_bytes
        self._limits = limits

    @property
    def buffered(self) -> int:
        return len(self._buffer)

    def feed(self, data: bytes) -> None:
        self._buffer += data

    def next_message(self) -> dict[str, Any] | None:
        """The next whole message, or None until more bytes arrive."""
        if len(self._buffer) < HEADER.size:
            return None
        (length,) = HEADER.unpack_from(self._buffer)
        if length > self._max:
            raise ProtocolError(
                ErrorCode.FRAME_TOO_LARGE,
                f"frame of {length} bytes exceeds the limit of {self._max}",
                "send smaller requests; logs and listings are streamed in pieces",
            )
        end = HEADER.size + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[HEADER.size : end])
        del self._buffer[:end]
        return decode_body(body, self._limits)

    def drain(self) -> Iterator[dict[str, Any]]:
        while (message := self.next_message()) is not None:
            yield message


def decode_body(body: bytes, limits: DecodeLimits = REPLY_LIMITS) -> dict[str, Any]:
    try:
        message = unpack(body, limits)
    except TooManyItems:
        raise ProtocolError(
            ErrorCode.BAD_FRAME,
            f"frame holds more than {limits.max_items} values",
            "send fewer values per frame",
        ) from None
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise ProtocolError(
            ErrorCode.BAD_FRAME, f"frame is not valid msgpack: {shown(exc, 200)}"
        ) from None
    if not isinstance(message, dict):
        raise ProtocolError(
            ErrorCode.BAD_FRAME, f"frame must be a msgpack map, got {type(message).__name__}"
        )
    return message


def shown(value: Any, limit: int = 80) -> str:
    """`repr` of a value from the wire, cut to `limit` characters: what a peer sends is echoed
    in errors and logs, never whole."""
    text = value if isinstance(value, BaseException) else repr(value)
    text = str(text)
    return text if len(text) <= limit else text[: limit - 3] + "..."


# --------------------------------------------------------------------------------------------
# Messages


# Features a daemon names in its hello, for what is newer than an op (`columns` of status).
FEATURE_COLUMNS = "status_columns"
FEATURES = (FEATURE_COLUMNS,)


def views_of(clusters: list[dict[str, Any]] | dict[str, Any]) -> list[dict[str, Any]]:
    """`status`'s clusters as maps, whether it sent maps or {columns, rows, optional}: a
    row holds a value per column, null where its view lacks an `optional` column (left out
    here, as the map would leave it out)."""
    if isinstance(clusters, list):
        return clusters
    columns = clusters["columns"]
    views = [dict(zip(columns, row, strict=True)) for row in clusters["rows"]]
    for key in clusters.get("optional", ()):
        for view in views:
            if view[key] is None:
                del view[key]
    return views


def hello(client: str) -> dict[str, Any]:
    return {"type": HELLO, "protocol": PROTOCOL_VERSION, "client": client}


def request(request_id: int, op: str, args: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": REQUEST, "id": request_id, "op": op, "args": dict(args)}


def reply_ok(request_id: int, result: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": REPLY, "id": request_id, "ok": True, "result": dict(result)}


def reply_error(request_id: int, error: ProtocolError) -> dict[str, Any]:
    return {"type": REPLY, "id": request_id, "ok": False, "error": error.to_wire()}


def event(request_id: int, name: str, data: Mapping[str, Any]) -> dict[str, Any]:
    return {"type": EVENT, "id": request_id, "event": name, "data": dict(data)}


def connection_error(error: ProtocolError) -> dict[str, Any]:
    return {"type": ERROR, "error": error.to_wire()}


# --------------------------------------------------------------------------------------------
# Ops and their arguments. Each op's arguments are a class of annotated fields with defaults;
# the daemon validates incoming maps against it with `parse_args`, the client builds maps with
# `to_wire`. They behave as keyword-only dataclasses (and type-check as such), but are built by
# OpArgs itself: generating a dozen real dataclasses (and importing `dataclasses`) was a fifth
# of clusterctl's start-up time.

Args = TypeVar("Args", bound="OpArgs")
_NO_DEFAULT: Any = object()


@typing.dataclass_transform(kw_only_default=True)
class OpArgs:
    op: ClassVar[str]
    streams: ClassVar[bool] = False
    # (name, default) in declaration order, base classes first; defaults copied per instance.
    _fields: ClassVar[tuple[tuple[str, Any], ...]] = ()

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        fields = dict(cls._fields)
        # inspect.get_annotations would cost clusterctl the import of inspect (4 ms).
        own = cls.__dict__.get("__annotations__", {})  # noqa: RUF063
        for name, annotation in own.items():
            if name.startswith("_") or str(annotation).startswith(("ClassVar", "typing.ClassVar")):
                continue
            fields[name] = cls.__dict__.get(name, _NO_DEFAULT)
        cls._fields = tuple(fields.items())

    def __init__(self, **values: Any) -> None:
        for name, default in self._fields:
            if name in values:
                value = values.pop(name)
            elif default is _NO_DEFAULT:
                raise TypeError(f"{type(self).__name__}: missing argument {name!r}")
            else:
                value = default.copy() if isinstance(default, list | dict) else default
            object.__setattr__(self, name, value)
        if values:
            raise TypeError(f"{type(self).__name__}: unexpected {', '.join(sorted(values))}")

    def __repr__(self) -> str:
        shown = ", ".join(f"{name}={getattr(self, name)!r}" for name, _ in self._fields)
        return f"{type(self).__name__}({shown})"

    def __eq__(self, other: object) -> bool:
        return type(other) is type(self) and to_wire(self) == to_wire(other)

    __hash__ = None  # type: ignore[assignment]


class PingArgs(OpArgs):
    op = "ping"


class StatusArgs(OpArgs):
    """Clusters as views; `verbose` adds the requested resources, hosts, tunnel and cloud
    name (a thousand clusters' worth of those is most of the reply)."""

    op = "status"
    clusters: list[str] = []  # copied per instance by OpArgs
    refresh: bool = False
    verbose: bool = False
    # `clusters` as {columns, rows} (see views_of): a quarter of the bytes of maps, and a
    # client decodes it in a fifth of the time. Daemons that offer it list FEATURE_COLUMNS.
    columns: bool = False


class TaskArgs(OpArgs):
    """What launch and exec share: where the task comes from and what overrides it.

    Exactly one of ``yaml_path`` (absolute path, read by the daemon), ``yaml_text`` (with
    ``source`` naming it in errors) or ``command`` is set. Relative paths inside the task
    (workdir, file_mounts) are resolved against ``cwd``.
    """

    cluster: str | None = None
    yaml_path: str | None = None
    yaml_text: str | None = None
    source: str = "<task>"
    command: str | None = None
    cwd: str = "/"
    envs: dict[str, str] = {}  # copied per instance by OpArgs
    secrets: dict[str, str] = {}
    num_nodes: int | None = None
    cpus: str | None = None
    detach: bool = False
    name: str | None = None
    # Refuse task fields that would be accepted without effect (else: warnings).
    strict: bool = False


class LaunchArgs(TaskArgs):
    op = "launch"
    streams = True
    infra: str | None = None
    idle_minutes: float | None = None
    down: bool = False
    # When no place has capacity: wait (a growing gap) and try every place again, until up.
    retry_until_up: bool = False


class ExecArgs(TaskArgs):
    op = "exec"
    streams = True


class QueueArgs(OpArgs):
    op = "queue"
    cluster: str
    skip_finished: bool = False


class LogsArgs(OpArgs):
    """Stream a job's log. ``job_id`` None means the cluster's latest job. ``tail`` 0 means
    from the start; ``offset`` resumes at a byte offset a previous stream reported."""

    op = "logs"
    streams = True
    cluster: str
    job_id: int | None = None
    follow: bool = True
    tail: int = 0
    offset: int | None = None


class CancelArgs(OpArgs):
    op = "cancel"
    cluster: str
    job_ids: list[int] = []
    all: bool = False


class StopArgs(OpArgs):
    op = "stop"
    streams = True
    cluster: str


class StartArgs(OpArgs):
    op = "start"
    streams = True
    cluster: str


class DownArgs(OpArgs):
    """Tear a cluster down; with `orphan`, `cluster` names an orphan (by its cloud name, as
    `status` lists them): its instances are terminated."""

    op = "down"
    streams = True
    cluster: str
    purge: bool = False
    orphan: bool = False


class EventsArgs(OpArgs):
    """The newest `limit` events; with `follow`, then every new one as an `event` frame
    named "cluster_event", until the client cancels or disconnects."""

    op = "events"
    streams = True  # with follow
    cluster: str | None = None
    limit: int = 100
    follow: bool = False


# What keeps a cluster from counting as idle: jobs and user SSH sessions (the default), jobs
# only, or nothing (a hard deadline from when autostop was set).
WAIT_FOR_CHOICES = ("jobs_and_ssh", "jobs", "none")


class AutostopArgs(OpArgs):
    """Set a cluster's autostop (`idle_minutes`, `down`, `wait_for`: jobs_and_ssh, jobs or
    none), or with `cancel`, remove it."""

    op = "autostop"
    cluster: str
    idle_minutes: float | None = None
    down: bool = False
    wait_for: str = "jobs_and_ssh"
    cancel: bool = False


class CheckArgs(OpArgs):
    """Which providers and ssh node pools are usable, and whether each host answers."""

    op = "check"


class ShowGpusArgs(OpArgs):
    """Accelerators in the catalogs: every instance type with one (of `name`, if given), its
    count, size, cheapest on-demand and spot price per hour, and regions."""

    op = "show_gpus"
    name: str | None = None
    infra: str | None = None  # one provider's only (kubernetes: its nodes, free and total)


class RequestsArgs(OpArgs):
    """Requests the daemon is working on (each with its latest progress), and with
    `active_only` false the newest finished ones too."""

    op = "requests"
    active_only: bool = True


class FollowRequestArgs(OpArgs):
    """Follow a daemon-owned request any client started: its events from the start, then
    live, and its outcome; one that has ended answers with its outcome at once."""

    op = "follow_request"
    streams = True
    request_id: int


class NodesArgs(OpArgs):
    """A cluster's nodes as its provider reports them now (the head first)."""

    op = "nodes"
    cluster: str


class JobsLaunchArgs(TaskArgs):
    """Submit a managed job: it gets a cluster of its own (named ``mj-ID-NAME``), is
    recovered when that cluster is lost, and the cluster is torn down when the job ends.
    Streams the job's log (``log`` events) unless ``detach``; the final reply carries the
    managed job's id, status and exit code."""

    op = "jobs_launch"
    streams = True
    infra: str | None = None


class JobsQueueArgs(OpArgs):
    """Managed jobs, newest first; without ``all``, only those not finished."""

    op = "jobs_queue"
    all: bool = False


class JobsLogsArgs(OpArgs):
    """A managed job's whole log across its attempts (a marker line at each recovery), as
    ``log`` events; with ``follow``, until the job ends. ``tail`` N > 0 starts with its last
    N lines instead (0: from the start).

    With ``controller``, the daemon's own log of the job instead: its status changes and
    other findings as ``managed_job_event`` events ``{id, ts, from_status, to_status,
    reason}`` and the daemon's log lines about it as ``daemon_log`` events ``{ts, level,
    message, fields}``, in time order (``tail``: the last N of both together)."""

    op = "jobs_logs"
    streams = True
    job_id: int
    follow: bool = True
    tail: int = 0
    controller: bool = False


class JobsEventsArgs(OpArgs):
    """A managed job's status history and the controller's decisions (each recovery, each
    relaunch round), oldest first; with ``after``, only those newer than that event id."""

    op = "jobs_events"
    job_id: int
    after: int = 0


class JobsCancelArgs(OpArgs):
    """Cancel managed jobs in any state; their clusters are torn down."""

    op = "jobs_cancel"
    job_ids: list[int] = []
    all: bool = False


class StorageLsArgs(OpArgs):
    """The buckets clusterd made (never any other): ``{buckets: [{name, region, persistent,
    created_for, created_at, clusters, objects, bytes}]}`` (objects and bytes null where S3
    did not answer)."""

    op = "storage_ls"


class StorageDeleteArgs(OpArgs):
    """Delete a bucket clusterd made, with everything in it; refused for a bucket it did not
    make, and for one a cluster uses."""

    op = "storage_delete"
    name: str


OPS: dict[str, type[OpArgs]] = {
    cls.op: cls
    for cls in (
        PingArgs,
        StatusArgs,
        LaunchArgs,
        ExecArgs,
        QueueArgs,
        LogsArgs,
        CancelArgs,
        StopArgs,
        StartArgs,
        DownArgs,
        EventsArgs,
        RequestsArgs,
        CheckArgs,
        AutostopArgs,
        ShowGpusArgs,
        FollowRequestArgs,
        NodesArgs,
        JobsLaunchArgs,
        JobsQueueArgs,
        JobsLogsArgs,
        JobsEventsArgs,
        JobsCancelArgs,
        StorageLsArgs,
        StorageDeleteArgs,
    )
}

# Fields whose values must never be logged or stored.
SECRET_FIELDS = frozenset({"secrets"})


def _describe(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is not None:
        inner = ", ".join(_describe(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{inner}]"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, a) for a in typing.get_args(tp))
    if tp is type(None):
        return value is None
    if tp is float:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if tp is int:
        return isinstance(value, int) and not isinstance(value, bool)
    if origin is list:
        (item,) = typing.get_args(tp)
        return isinstance(value, list) and all(_matches(v, item) for v in value)
    if origin is dict:
        key, item = typing.get_args(tp)
        return isinstance(value, dict) and all(
            _matches(k, key) and _matches(v, item) for k, v in value.items()
        )
    return isinstance(value, tp)


_SCHEMAS: dict[type[OpArgs], tuple[dict[str, Any], tuple[str, ...]]] = {}


def _schema(cls: type[OpArgs]) -> tuple[dict[str, Any], tuple[str, ...]]:
    """Field types and required fields of an op's arguments (resolved once, on first use:
    the client never validates, so it never pays for resolving annotations)."""
    schema = _SCHEMAS.get(cls)
    if schema is None:
        hints = typing.get_type_hints(cls)
        types_by_name = {name: hints[name] for name, _ in cls._fields}
        required = tuple(name for name, default in cls._fields if default is _NO_DEFAULT)
        schema = _SCHEMAS[cls] = (types_by_name, required)
    return schema


def parse_args(cls: type[Args], raw: Any) -> Args:
    """Validate a wire map against an op's argument dataclass; ProtocolError names the field."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"{cls.op}: args must be a map")
    types_by_name, required = _schema(cls)
    unknown = sorted(str(k) for k in raw if k not in types_by_name)
    if unknown:
        listed = ", ".join(k if len(k) <= 40 else k[:37] + "..." for k in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise ProtocolError(
            ErrorCode.INVALID_ARGUMENT,
            f"{cls.op}: unknown argument {listed}{more}",
            f"accepted arguments: {', '.join(types_by_name)}",
        )
    missing = [name for name in required if name not in raw]
    if missing:
        raise ProtocolError(
            ErrorCode.INVALID_ARGUMENT, f"{cls.op}: missing argument {', '.join(missing)}"
        )
    for name, value in raw.items():
        expected = types_by_name[name]
        if not _matches(value, expected):
            raise ProtocolError(
                ErrorCode.INVALID_ARGUMENT,
                f"{cls.op}: argument {name!r} must be {_describe(expected)}, "
                f"got {type(value).__name__}",
            )
    return cls(**raw)


def to_wire(args: OpArgs) -> dict[str, Any]:
    return {name: getattr(args, name) for name, _ in args._fields}
