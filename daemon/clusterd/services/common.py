"""Checks and lookups shared by the cluster and job services."""

from __future__ import annotations

import getpass
import re
import secrets
from collections.abc import Iterable

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.requests import RunningRequest
from clusterd.state.clusters import ClusterRecord, ClusterStore

# SkyPilot's rule for cluster names, with its length cap.
NAME_PATTERN = re.compile(r"^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")
MAX_NAME_LENGTH = 63


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_LENGTH or not NAME_PATTERN.fullmatch(name):
        shown = name if len(name) <= 80 else name[:77] + "..."
        raise ProtocolError(
            ErrorCode.INVALID_NAME,
            f"invalid cluster name {shown!r}",
            f"start with a letter, then letters, digits, '-', '_' or '.', ending in a letter "
            f"or digit; at most {MAX_NAME_LENGTH} characters",
        )
    return name


def generated_name() -> str:
    user = re.sub(r"[^a-z0-9]", "", getpass.getuser().lower())[:8] or "user"
    return f"sky-{secrets.token_hex(2)}-{user}"


def cloud_name_for(name: str) -> str:
    """The provider-side name: the user's name plus a suffix unique to this launch, so a
    cluster downed and launched again never meets leftovers of its earlier self."""
    base = re.sub(r"[^a-z0-9-]", "-", name.lower())[:50].strip("-") or "c"
    return f"{base}-{secrets.token_hex(3)}"


def require_cluster(store: ClusterStore, name: str) -> ClusterRecord:
    check_name(name)
    record = store.get(name)
    if record is None:
        raise ProtocolError(
            ErrorCode.CLUSTER_NOT_FOUND,
            f"cluster {name} does not exist",
            "see `clusterctl status` for your clusters, or `clusterctl launch -c "
            f"{name} TASK` to create it",
        )
    return record


def require_up(record: ClusterRecord) -> ClusterRecord:
    if record.status != ClusterStatus.UP:
        hint = (f"start it with `clusterctl start {record.name}`"
                if record.status == ClusterStatus.STOPPED
                else f"bring it up with `clusterctl launch -c {record.name}`")
        reason = f" ({record.status_reason})" if record.status_reason else ""
        raise ProtocolError(
            ErrorCode.CLUSTER_NOT_UP,
            f"cluster {record.name} is {record.status}{reason}",
            hint,
        )
    return record


def require_head(record: ClusterRecord) -> ClusterRecord:
    """Reading and cancelling jobs needs the head's agent, not every node: a cluster that is
    INIT because it lost a worker still answers for its jobs (and the one that failed with
    the worker). One with no runtime recorded is refused as require_up refuses it."""
    if record.status == ClusterStatus.INIT and (record.handle or {}).get("runtime"):
        return record
    return require_up(record)


def head_unreachable(record: ClusterRecord, error: ProtocolError) -> ProtocolError:
    """The error to raise when the agent of a cluster let in by require_head does not
    answer: for an INIT cluster, that it is not up (and why), as require_up says it."""
    if record.status == ClusterStatus.INIT and error.code == ErrorCode.AGENT_UNREACHABLE:
        try:
            require_up(record)
        except ProtocolError as not_up:
            return not_up
    return error


async def announce_warnings(request: RunningRequest, store: ClusterStore, name: str,
                            warnings: Iterable[str]) -> None:
    """Task fields accepted without effect: said in the request's output, kept as events."""
    for warning in dict.fromkeys(warnings):
        await request.progress(f"warning: {warning}", "warning")
        await store.add_event(name, "warning", warning, request.id)
