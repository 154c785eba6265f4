"""The protocol's ops and their arguments, with the checks the daemon runs on what a client
sends. Part of clusterctl.protocol, which re-exports every name: import them from there."""

from __future__ import annotations

from clusterctl._text import clipped

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:  # (the daemon's checks of what clients send import it where they run)
    from typing import Any, ClassVar, TypeVar

    # typing_extensions' (in the type checker's own stubs): typing has it from 3.11 only,
    # and these modules run on nodes whose Python is 3.10.
    from typing_extensions import dataclass_transform

    Args = TypeVar("Args", bound="OpArgs")
else:
    def dataclass_transform(**_: object) -> object:
        return lambda cls: cls

# --------------------------------------------------------------------------------------------
# Ops and their arguments. Each op's arguments are a class of annotated fields with defaults;
# the daemon validates incoming maps against it with `parse_args`, the client builds maps with
# `to_wire`. They behave as keyword-only dataclasses (and type-check as such), but are built by
# OpArgs itself: generating a dozen real dataclasses (and importing `dataclasses`) was a fifth
# of clusterctl's start-up time.

_NO_DEFAULT: Any = object()


@dataclass_transform(kw_only_default=True)
class OpArgs:
    op: ClassVar[str]
    streams: ClassVar[bool] = False
    # (name, default) in declaration order, base classes first; defaults copied per instance.
    _fields: ClassVar[tuple[tuple[str, Any], ...]] = ()
    # Arguments newer than the first daemons, sent only when set (see to_wire).
    _newer: ClassVar[frozenset[str]] = frozenset()

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


class RunArgs(TaskArgs):
    """What `launch` and `exec` add to the task arguments: SkyPilot's overrides of the task's
    resources and workdir (each null: the task's own; a string "none": cleared, as SkyPilot's
    flags clear a field), `no_setup`, and `dryrun` (the plan, and nothing made).

    Newer than the first daemons: sent only when set (see `_newer`), so that a daemon from
    before them still takes every request that does not use them; a client checks the
    daemon's hello for FEATURE_RUN_OVERRIDES before setting one."""

    _newer: ClassVar[frozenset[str]] = frozenset({
        "memory", "gpus", "instance_type", "use_spot", "disk_size", "ports", "image_id",
        "workdir", "no_setup", "dryrun"})
    memory: str | None = None  # "32", "32+", "none"
    gpus: str | None = None  # resources.accelerators: "A100:2", "A100", "none"
    instance_type: str | None = None
    use_spot: bool | None = None
    disk_size: int | None = None  # GB
    ports: list[str] | None = None  # ["8080", "10000-10010"]; ["none"]: no ports
    image_id: str | None = None
    workdir: str | None = None  # a local directory, relative to cwd
    no_setup: bool = False  # launch: skip the task's setup
    dryrun: bool = False  # the plan only: nothing is made, run or recorded


class LaunchArgs(RunArgs):
    op = "launch"
    streams = True
    infra: str | None = None
    idle_minutes: float | None = None
    down: bool = False
    # When no place has capacity: wait (a growing gap) and try every place again, until up.
    retry_until_up: bool = False


class ExecArgs(RunArgs):
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
    """Which providers and ssh node pools are usable, and whether each host answers; with
    `providers`, only those (`[]`: every one)."""

    op = "check"
    providers: list[str] = []


class ShowGpusArgs(OpArgs):
    """Accelerators in the catalogs: every instance type with one (of `name`, if given), its
    count, size, cheapest on-demand and spot price per hour, and regions. With `count`,
    only instance types with that many (and nodes with at least that many)."""

    op = "show_gpus"
    name: str | None = None
    count: float | None = None
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


class NodeUsageArgs(OpArgs):
    """An UP cluster's nodes' recent CPU, memory and GPU use, as its agent sampled it (the
    last hour at most); with ``since`` (Unix seconds), only samples newer than that."""

    op = "node_usage"
    cluster: str
    since: float = 0.0


class SSHArgs(OpArgs):
    """How to reach an UP cluster's node with OpenSSH as the daemon does (`clusterctl ssh`):
    node 0 is the head, N the Nth worker. Nothing is connected; the client runs ssh."""

    op = "ssh"
    cluster: str
    node: int = 0


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
    ``log`` events (``job_id`` None: the newest job's); with ``follow``, until the job
    ends. ``tail`` N > 0 starts with its last N lines instead (0: from the start).

    With ``controller``, the daemon's own log of the job instead: its status changes and
    other findings as ``managed_job_event`` events ``{id, ts, from_status, to_status,
    reason}`` and the daemon's log lines about it as ``daemon_log`` events ``{ts, level,
    message, fields}``, in time order (``tail``: the last N of both together)."""

    op = "jobs_logs"
    streams = True
    job_id: int | None = None  # None: the newest managed job
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
    """Cancel managed jobs in any state; their clusters are torn down. `name`: the one
    unfinished job of that name (refused if several have it, as SkyPilot does)."""

    op = "jobs_cancel"
    job_ids: list[int] = []
    all: bool = False
    name: str | None = None


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


class HistoryArgs(OpArgs):
    """Torn-down clusters, newest first, with their jobs and what was kept of their logs.
    ``cluster`` "" means every cluster's; ``limit`` bounds the rows."""

    op = "history"
    cluster: str = ""
    limit: int = 100


class CostReportArgs(OpArgs):
    """What clusters and managed jobs cost over the last ``days`` (1..3650): per cluster
    (torn-down ones too) with the split over its jobs, setup, idle and stopped disks; per
    managed job with what its recoveries cost; per provider; per UTC day; totals.
    ``limit`` bounds the clusters listed, the costliest first (0: every one); the totals
    are over all of them. ``cluster`` lists that cluster's incarnations alone (every one in
    the window), the totals still over all."""

    op = "cost_report"
    days: int = 30
    limit: int = 100
    cluster: str = ""


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
        NodeUsageArgs,
        SSHArgs,
        JobsLaunchArgs,
        JobsQueueArgs,
        JobsLogsArgs,
        JobsEventsArgs,
        JobsCancelArgs,
        StorageLsArgs,
        StorageDeleteArgs,
        HistoryArgs,
        CostReportArgs,
    )
}

# Fields whose values must never be logged or stored.
SECRET_FIELDS = frozenset({"secrets"})


def _describe(tp: Any) -> str:
    import types
    import typing

    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in typing.get_args(tp))
    if origin is not None:
        inner = ", ".join(_describe(a) for a in typing.get_args(tp))
        return f"{origin.__name__}[{inner}]"
    return "null" if tp is type(None) else getattr(tp, "__name__", str(tp))


def _matches(value: Any, tp: Any) -> bool:
    import types
    import typing

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
        import typing

        # The annotations name typing's Any and ClassVar, which this module imports for the
        # type checker only.
        hints = typing.get_type_hints(cls, localns={"Any": typing.Any,
                                                    "ClassVar": typing.ClassVar})
        types_by_name = {name: hints[name] for name, _ in cls._fields}
        required = tuple(name for name, default in cls._fields if default is _NO_DEFAULT)
        schema = _SCHEMAS[cls] = (types_by_name, required)
    return schema


def protocol_error(code: str, message: str, hint: str = "") -> Exception:
    """ProtocolError(ErrorCode(code), ...), for this module and protocol's framing. The
    vocabulary is imported only here: its enums cost `enum` (3 ms of a clusterctl run), and a
    run that goes well raises none."""
    from clusterctl._vocabulary import ErrorCode, ProtocolError

    return ProtocolError(ErrorCode(code), message, hint)


def parse_args(cls: type[Args], raw: Any) -> Args:
    """Validate a wire map against an op's argument dataclass; ProtocolError names the field."""
    if raw is None:
        raw = {}
    if not isinstance(raw, dict):
        raise protocol_error("INVALID_ARGUMENT", f"{cls.op}: args must be a map")
    types_by_name, required = _schema(cls)
    unknown = sorted(str(k) for k in raw if k not in types_by_name)
    if unknown:
        listed = ", ".join(clipped(k, 40) for k in unknown[:5])
        more = f" (and {len(unknown) - 5} more)" if len(unknown) > 5 else ""
        raise protocol_error(
            "INVALID_ARGUMENT",
            f"{cls.op}: unknown argument {listed}{more}",
            f"accepted arguments: {', '.join(types_by_name)}",
        )
    missing = [name for name in required if name not in raw]
    if missing:
        raise protocol_error("INVALID_ARGUMENT",
                             f"{cls.op}: missing argument {', '.join(missing)}")
    for name, value in raw.items():
        expected = types_by_name[name]
        if not _matches(value, expected):
            raise protocol_error(
                "INVALID_ARGUMENT",
                f"{cls.op}: argument {name!r} must be {_describe(expected)}, "
                f"got {type(value).__name__}",
            )
    return cls(**raw)


def to_wire(args: OpArgs) -> dict[str, Any]:
    """The arguments as a wire map; a newer argument (`_newer`) only when it differs from its
    default, so that older daemons, which refuse arguments they do not know, still take it."""
    return {name: value for name, default in args._fields
            if (value := getattr(args, name)) != default or name not in args._newer}
