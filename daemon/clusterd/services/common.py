"""Checks and lookups shared by the cluster and job services."""

from __future__ import annotations

import getpass
import re
import secrets
from collections.abc import Collection, Iterable

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError, clipped, shown
from clusterd.providers.base import Provider, ProviderHandle
from clusterd.requests import RunningRequest
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.tasks import fields
from clusterd.tasks.spec import Infra, Resources, TaskSpec

# SkyPilot's rule for cluster names, with its length cap.
NAME_PATTERN = re.compile(r"^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")
MAX_NAME_LENGTH = 63


def check_name(name: str) -> str:
    if not name or len(name) > MAX_NAME_LENGTH or not NAME_PATTERN.fullmatch(name):
        raise ProtocolError(
            ErrorCode.INVALID_NAME,
            f"invalid cluster name {shown(name, 40)}",
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


def provider_handle(record: ClusterRecord, provider: Provider) -> ProviderHandle:
    """The provider's handle of the cluster; for one whose create call never answered, the
    handle of where a launch was making it (if known), with no nodes."""
    if record.handle.provider is not None:
        return record.handle.provider
    return provider.handle_for_intent(record.cloud_name, record.handle.intent)


def require_head(record: ClusterRecord) -> ClusterRecord:
    """Reading and cancelling jobs needs the head's agent, not every node: a cluster that is
    INIT because it lost a worker still answers for its jobs (and the one that failed with
    the worker). One with no runtime recorded is refused as require_up refuses it."""
    if record.status == ClusterStatus.INIT and record.handle.runtime is not None:
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


def fit_to_cluster(record: ClusterRecord, task: TaskSpec, honoured: Collection[str],
                   override: Infra | None = None,
                   strict: bool = False) -> tuple[Resources, list[str]]:
    """Whether the task can run on an existing cluster, checked as SkyPilot checks a task
    against the cluster it is sent to (by `launch` onto it, and by `exec`). Returns the
    task's resources that the cluster meets (one of its alternatives, if it has several) and
    warnings for the fields it sets that have no effect on the cluster's provider (which
    honours the fields in `honoured`): the same check (fields.on_provider) a new launch makes
    of each provider it may try. Raises
    CLUSTER_MISMATCH for what the cluster cannot give: another provider or place, more
    nodes, CPUs, memory or accelerators than it has, a field that cannot apply on its
    provider, or (with `strict`) one that would have no effect there."""
    options = task.resource_options()
    here = [r for r in options if _lives_in(override or r.infra, record)]
    if not here:
        asked = ", ".join(dict.fromkeys(str(override or r.infra) for r in options))
        raise ProtocolError(
            ErrorCode.CLUSTER_MISMATCH,
            f"cluster {record.name} runs on {_where(record)}, not {asked}",
            "launch a cluster there under another name, or drop the infra (and --infra) to "
            "use this one as it is",
        )
    if task.num_nodes > record.num_nodes:
        raise ProtocolError(
            ErrorCode.CLUSTER_MISMATCH,
            f"the task asks for {task.num_nodes} nodes; cluster {record.name} has "
            f"{record.num_nodes}",
            "launch a new cluster under another name for more nodes",
        )
    shortfalls = [_shortfall(record, r) for r in here]
    fits = [r for r, short in zip(here, shortfalls, strict=True) if short is None]
    if not fits:
        raise ProtocolError(ErrorCode.CLUSTER_MISMATCH, str(shortfalls[0]),
                            "launch a new cluster with what the task needs under another name")
    placed = record.launched_resources
    have = ((placed.accelerator if placed else None) or "").lower()
    wanted = next((r for r in fits if have and (r.accelerator or "").lower() == have), fits[0])
    warnings, refusals = fields.on_provider(wanted, record.provider, honoured, strict)
    if refusals:
        raise ProtocolError(
            ErrorCode.CLUSTER_MISMATCH,
            f"{task.source} on cluster {record.name}: {'; '.join(refusals)}",
            fields.STRICT_HINT if strict else "drop the field, or launch a cluster where it "
                                              "applies under another name",
        )
    return wanted, warnings


def _where(record: ClusterRecord) -> str:
    placed = record.launched_resources
    return placed.infra if placed is not None else record.provider


def _lives_in(infra: Infra, record: ClusterRecord) -> bool:
    """Whether the cluster is where `infra` points (each part it names, if the record says)."""
    placed = record.launched_resources
    return all(asked is None or known is None or asked == known for asked, known in (
        (infra.provider, record.provider), (infra.region, placed and placed.region),
        (infra.zone, placed and placed.zone)))


def _shortfall(record: ClusterRecord, wanted: Resources) -> str | None:
    """What a node of the cluster lacks of what `wanted` asks for (None: nothing), by the
    record of what its nodes were placed with."""
    have = record.launched_resources
    cpus, memory = (have.cpus, have.memory_gb) if have is not None else (None, None)
    if wanted.cpus is not None and cpus and wanted.cpus > cpus:
        return (f"the task asks for {wanted.cpus:g} CPUs per node; {record.name}'s nodes have "
                f"{cpus:g}")
    if wanted.memory_gb is not None and memory and wanted.memory_gb > memory:
        return (f"the task asks for {wanted.memory_gb:g} GB of memory per node; "
                f"{record.name}'s nodes have {memory:.1f}")
    if wanted.accelerator:
        name, count = ((have.accelerator, float(have.accelerator_count)) if have is not None
                       else (None, 0.0))
        if (not name or str(name).lower() != wanted.accelerator.lower()
                or wanted.accelerator_count > count):
            has = f"{name}:{count:g}" if name else "no accelerators"
            return (f"the task asks for {wanted.accelerator}:{wanted.accelerator_count:g} per "
                    f"node; {record.name}'s nodes have {has}")
    return None


def brief(message: str, limit: int = 300) -> str:
    """An error fit for an event: its first line and, when a log tail follows, its last."""
    lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
    if not lines:
        return ""
    text = lines[0] if len(lines) == 1 else f"{lines[0]} ... {lines[-1]}"
    return clipped(text, limit)
