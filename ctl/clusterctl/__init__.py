"""clusterctl: the client of clusterd, and the one definition of its wire protocol.

Other local tools import `Client` and the argument types from here.
"""

from clusterctl._version import __version__
from clusterctl.client import Client, ClusterdError, DaemonUnavailable, Stream
from clusterctl.protocol import (
    PROTOCOL_VERSION,
    AutostopArgs,
    CancelArgs,
    CheckArgs,
    ClusterStatus,
    DownArgs,
    ErrorCode,
    EventsArgs,
    ExecArgs,
    ExitCode,
    JobStatus,
    LaunchArgs,
    LogsArgs,
    PingArgs,
    QueueArgs,
    RequestsArgs,
    StartArgs,
    StatusArgs,
    StopArgs,
)

__all__ = [
    "PROTOCOL_VERSION",
    "AutostopArgs",
    "CancelArgs",
    "CheckArgs",
    "Client",
    "ClusterStatus",
    "ClusterdError",
    "DaemonUnavailable",
    "DownArgs",
    "ErrorCode",
    "EventsArgs",
    "ExecArgs",
    "ExitCode",
    "JobStatus",
    "LaunchArgs",
    "LogsArgs",
    "PingArgs",
    "QueueArgs",
    "RequestsArgs",
    "StartArgs",
    "StatusArgs",
    "StopArgs",
    "Stream",
    "__version__",
]
