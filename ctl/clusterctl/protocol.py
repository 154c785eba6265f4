"""The clusterctl ⇄ clusterd wire protocol: its one definition.

Both the client and the daemon import this module; the daemon never defines a frame, an op or
an error code of its own. Its words (error codes, statuses, exit codes) are in _vocabulary.py
and its ops in ops.py; this module re-exports both, and is what everyone imports. Standard
library and msgpack only: clusterctl must start fast.

A frame is a 4-byte big-endian length followed by one msgpack map of that many bytes. The
message kinds, in order of appearance on a connection:

* ``hello`` (client → daemon, first frame): ``{"type": "hello", "protocol": 1, "client": str}``;
  the daemon answers with its own hello (``server``, ``protocol``, ``ops``, and ``notices``:
  lines for the user, such as a budget past its warning) or an ``error`` frame and closes.
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

import collections
import struct

import msgpack

# Re-exported: clients and the daemon know them as protocol.X.
from clusterctl._limits import MAX_FRAME_BYTES as MAX_FRAME_BYTES
from clusterctl._limits import REPLY_LIMITS as REPLY_LIMITS
from clusterctl._limits import REQUEST_LIMITS as REQUEST_LIMITS
from clusterctl._limits import DecodeLimits as DecodeLimits
from clusterctl._limits import TooManyItems, unpack
from clusterctl._text import clipped as clipped
from clusterctl.ops import OPS as OPS
from clusterctl.ops import SECRET_FIELDS as SECRET_FIELDS
from clusterctl.ops import WAIT_FOR_CHOICES as WAIT_FOR_CHOICES
from clusterctl.ops import AutostopArgs as AutostopArgs
from clusterctl.ops import CancelArgs as CancelArgs
from clusterctl.ops import CheckArgs as CheckArgs
from clusterctl.ops import CostReportArgs as CostReportArgs
from clusterctl.ops import DownArgs as DownArgs
from clusterctl.ops import EventsArgs as EventsArgs
from clusterctl.ops import ExecArgs as ExecArgs
from clusterctl.ops import FollowRequestArgs as FollowRequestArgs
from clusterctl.ops import HistoryArgs as HistoryArgs
from clusterctl.ops import JobsCancelArgs as JobsCancelArgs
from clusterctl.ops import JobsEventsArgs as JobsEventsArgs
from clusterctl.ops import JobsLaunchArgs as JobsLaunchArgs
from clusterctl.ops import JobsLogsArgs as JobsLogsArgs
from clusterctl.ops import JobsQueueArgs as JobsQueueArgs
from clusterctl.ops import LaunchArgs as LaunchArgs
from clusterctl.ops import LogsArgs as LogsArgs
from clusterctl.ops import NodesArgs as NodesArgs
from clusterctl.ops import NodeUsageArgs as NodeUsageArgs
from clusterctl.ops import OpArgs as OpArgs
from clusterctl.ops import PingArgs as PingArgs
from clusterctl.ops import QueueArgs as QueueArgs
from clusterctl.ops import RequestsArgs as RequestsArgs
from clusterctl.ops import RunArgs as RunArgs
from clusterctl.ops import ShowGpusArgs as ShowGpusArgs
from clusterctl.ops import SSHArgs as SSHArgs
from clusterctl.ops import StartArgs as StartArgs
from clusterctl.ops import StatusArgs as StatusArgs
from clusterctl.ops import StopArgs as StopArgs
from clusterctl.ops import StorageDeleteArgs as StorageDeleteArgs
from clusterctl.ops import StorageLsArgs as StorageLsArgs
from clusterctl.ops import TaskArgs as TaskArgs
from clusterctl.ops import parse_args as parse_args
from clusterctl.ops import protocol_error
from clusterctl.ops import to_wire as to_wire

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from collections.abc import Iterator, Mapping
    from typing import Any

    from clusterctl._vocabulary import NOT_FOUND_CODES as NOT_FOUND_CODES
    from clusterctl._vocabulary import ClusterStatus as ClusterStatus
    from clusterctl._vocabulary import ErrorCode as ErrorCode
    from clusterctl._vocabulary import ExitCode as ExitCode
    from clusterctl._vocabulary import JobStatus as JobStatus
    from clusterctl._vocabulary import ManagedJobStatus as ManagedJobStatus
    from clusterctl._vocabulary import ProtocolError as ProtocolError
    from clusterctl._vocabulary import RequestError as RequestError
    from clusterctl._vocabulary import exit_code_for_job as exit_code_for_job
    from clusterctl._vocabulary import exit_code_for_managed_job as exit_code_for_managed_job
    from clusterctl._vocabulary import shown as shown

# The protocol's words are enums, and importing `enum` (with the `functools` and `collections`
# it brings) is 3 ms of a 16 ms clusterctl run that, when all goes well, never needs one. So
# they load on first use (PEP 562); `from clusterctl.protocol import ErrorCode` works as ever.
_VOCABULARY = frozenset({
    "NOT_FOUND_CODES", "ClusterStatus", "ErrorCode", "ExitCode", "JobStatus",
    "ManagedJobStatus", "ProtocolError", "RequestError", "exit_code_for_job",
    "exit_code_for_managed_job", "shown",
})


def __getattr__(name: str) -> Any:
    if name not in _VOCABULARY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from clusterctl import _vocabulary

    value = getattr(_vocabulary, name)
    globals()[name] = value
    return value

PROTOCOL_VERSION = 1
HEADER = struct.Struct(">I")

HELLO = "hello"
REQUEST = "request"
REPLY = "reply"
EVENT = "event"
CANCEL = "cancel"
ERROR = "error"


# --------------------------------------------------------------------------------------------
# Framing


def encode_frame(message: Mapping[str, Any]) -> bytes:
    body: bytes = msgpack.packb(message, use_bin_type=True)
    if len(body) > MAX_FRAME_BYTES:
        raise protocol_error(
            "FRAME_TOO_LARGE",
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
            raise protocol_error(
                "FRAME_TOO_LARGE",
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
        raise protocol_error(
            "BAD_FRAME",
            f"frame holds more than {limits.max_items} values",
            "send fewer values per frame",
        ) from None
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        from clusterctl._vocabulary import shown

        raise protocol_error("BAD_FRAME",
                             f"frame is not valid msgpack: {shown(exc, 200)}") from None
    if not isinstance(message, dict):
        raise protocol_error(
            "BAD_FRAME", f"frame must be a msgpack map, got {type(message).__name__}"
        )
    return message


# --------------------------------------------------------------------------------------------
# Messages


# Features a daemon names in its hello, for what is newer than an op (`columns` of status).
FEATURE_COLUMNS = "status_columns"
# The resource, workdir, no_setup and dryrun arguments of `launch` and `exec` (RunArgs).
FEATURE_RUN_OVERRIDES = "run_overrides"
FEATURES = (FEATURE_COLUMNS, FEATURE_RUN_OVERRIDES)
# The daemon's hello may carry lines for the user (a budget past its warning): every
# clusterctl command prints them on stderr. `alerts` are the same, as maps saying how serious
# each is and what it is of, for clients that draw them (the dashboard's banner).
HELLO_NOTICES = "notices"
HELLO_ALERTS = "alerts"
NOTICE_WARN = "warn"
NOTICE_ERROR = "error"  # a budget exceeded: launches are refused and its action taken
NOTICE_BUDGET = "budget"  # what a notice is of
NOTICE_IDLE = "idle"


# A named tuple, not a dataclass: clusterctl must start fast, and dataclasses costs ~15 ms.
class Notice(collections.namedtuple("Notice", ("text", "level", "kind"),
                                    defaults=(NOTICE_WARN, ""))):
    """`level`: NOTICE_WARN or NOTICE_ERROR; `kind`: NOTICE_BUDGET or NOTICE_IDLE ("" from a daemon
    that does not say)."""

    text: str
    level: str
    kind: str

    def to_wire(self) -> dict[str, str]:
        return {"text": self.text, "level": self.level, "kind": self.kind}


def notices_of(server_hello: Mapping[str, Any]) -> list[str]:
    """The hello's notices, as strings (an older daemon sends none)."""
    found = server_hello.get(HELLO_NOTICES) or []
    return [str(line) for line in found] if isinstance(found, list) else []


def alerts_of(server_hello: Mapping[str, Any]) -> list[Notice]:
    """The hello's notices with their level and kind; a daemon from before `alerts` sent
    lines only, read as warnings."""
    found = server_hello.get(HELLO_ALERTS)
    if not isinstance(found, list):
        return [Notice(line) for line in notices_of(server_hello)]
    return [Notice(str(alert.get("text", "")),
                   NOTICE_ERROR if alert.get("level") == NOTICE_ERROR else NOTICE_WARN,
                   str(alert.get("kind", "")))
            for alert in found if isinstance(alert, dict)]


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
