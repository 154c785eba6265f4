"""clusterctl: the client of clusterd, and the one definition of its wire protocol.

Other local tools import `Client` and the argument types from here; `AsyncClient` (asyncio)
too, imported on first use (clusterctl itself never pays for asyncio).
"""

from __future__ import annotations

from clusterctl import protocol
from clusterctl._version import __version__
from clusterctl.client import Client, ClusterdError, DaemonUnavailable, Stream
from clusterctl.protocol import (
    PROTOCOL_VERSION,
    AutostopArgs,
    CancelArgs,
    CheckArgs,
    DownArgs,
    EventsArgs,
    ExecArgs,
    FollowRequestArgs,
    LaunchArgs,
    LogsArgs,
    NodesArgs,
    NodeUsageArgs,
    PingArgs,
    QueueArgs,
    RequestsArgs,
    StartArgs,
    StatusArgs,
    StopArgs,
)

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import Any

    from clusterctl.protocol import ClusterStatus, ErrorCode, ExitCode, JobStatus

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
    "FollowRequestArgs",
    "JobStatus",
    "LaunchArgs",
    "LogsArgs",
    "NodeUsageArgs",
    "NodesArgs",
    "PingArgs",
    "QueueArgs",
    "RequestsArgs",
    "StartArgs",
    "StatusArgs",
    "StopArgs",
    "Stream",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in ("AsyncClient", "AsyncStream"):
        from clusterctl import aio

        return getattr(aio, name)
    if name in ("ClusterStatus", "ErrorCode", "ExitCode", "JobStatus"):
        return getattr(protocol, name)  # enums, loaded on first use (see protocol)
    raise AttributeError(f"module 'clusterctl' has no attribute {name!r}")
