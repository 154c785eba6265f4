"""The protocol's words: error codes, job and cluster statuses, exit codes, and the error that
carries a code. Part of clusterctl.protocol, which re-exports every name: import them from
there."""

from __future__ import annotations

import enum

from clusterctl import _exit_codes
from clusterctl._text import clipped

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import Any


class _StrEnum(str, enum.Enum):
    """enum.StrEnum, which Python 3.10 lacks (these words are spoken on nodes too, and a node's
    Python may be 3.10): a member is its value, in str() and format() alike."""

    def __str__(self) -> str:
        return str.__str__(self)

    def __format__(self, spec: str) -> str:
        return str.__format__(self, spec)


class ErrorCode(_StrEnum):
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


class JobStatus(_StrEnum):
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


class ClusterStatus(_StrEnum):
    INIT = "INIT"
    UP = "UP"
    STOPPED = "STOPPED"
    TERMINATED = "TERMINATED"  # only in events: the record has left the live table


class ManagedJobStatus(_StrEnum):
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

    SUCCEEDED = _exit_codes.SUCCEEDED
    ERROR = _exit_codes.ERROR
    FAILED = _exit_codes.FAILED
    NOT_FINISHED = _exit_codes.NOT_FINISHED
    NOT_FOUND = _exit_codes.NOT_FOUND
    CANCELLED = _exit_codes.CANCELLED


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


class ProtocolError(Exception):
    """The daemon's general user-facing error, not only a frame that breaks the protocol: any
    failure a request ends with (a bad frame or argument, a cluster not found, a launch that
    found no capacity, a lock timeout, ...). It carries what the reply's error carries (see
    docs/protocol.md): a stable `ErrorCode`, a message and a hint; `to_wire` is that error.
    The name is historical (renaming it touches nearly every module); `RequestError` names the
    same class for new code. Clients see it as `clusterctl.ClusterdError`."""

    def __init__(self, code: ErrorCode, message: str, hint: str = "") -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.hint = hint

    def to_wire(self) -> dict[str, str]:
        return {"code": str(self.code), "message": self.message, "hint": self.hint}


RequestError = ProtocolError


def shown(value: Any, limit: int = 80) -> str:
    """`repr` of a value from the wire, cut to `limit` characters: what a peer sends is echoed
    in errors and logs, never whole."""
    text = value if isinstance(value, BaseException) else repr(value)
    return clipped(str(text), limit)
