"""A cluster's objects on the API server: made (adopting what a retried or resumed create finds
there already, if it made it: see _not_made_by), waited for (scheduled, running, ready; a pod
the scheduler cannot place past the provision timeout is capacity, with the scheduler's
reason), listed (one call per context for every cluster of this daemon), and removed (nothing
labelled with the cluster stays).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
from kubernetes_asyncio.client.exceptions import ApiException

from clusterd import log
from clusterd.concurrency import first_error
from clusterd.nodes import NodeStatus
from clusterd.providers.base import BlockScope, ProvisionError
from clusterd.providers.kubernetes.api import KubeApi
from clusterd.providers.kubernetes.handle import KubernetesPod
from clusterd.providers.kubernetes.manifests import (
    ANNOTATION_CREATE_TOKEN,
    LABEL_CLOUD_NAME,
    LABEL_MANAGED_BY,
    PodSpec,
    pod_manifest,
    pod_name,
    ports_service_manifest,
    ssh_service_manifest,
    ssh_service_name,
)

logger = log.get("clusterd.kubernetes")

POLL_S = 0.5
DELETE_TIMEOUT_S = 120.0
# Pod waiting reasons that no amount of waiting fixes.
STUCK = frozenset({"ErrImageNeverPull", "ImagePullBackOff", "ErrImagePull", "InvalidImageName",
                   "CreateContainerConfigError", "CreateContainerError"})


def selector(cloud_name: str | None, managed_by: str) -> str:
    parts = [f"{LABEL_MANAGED_BY}={managed_by}"]
    if cloud_name:
        parts.append(f"{LABEL_CLOUD_NAME}={cloud_name}")
    return ",".join(parts)


def _not_made_by(found: Any, kind: str, manifest: dict[str, Any],
                 known_uids: frozenset[str]) -> str | None:
    """Why an object found under the name of one we create is not ours, or None if it is:
    a pod is ours if it carries this create's token (a create retried, or resumed after the
    daemon died) or is one the cluster already had (a repair keeps the nodes that survive;
    the API server gives uids, nobody can choose one). Labels prove nothing: anyone who can
    list pods can copy them, and a pod adopted gets the runtime, its secrets and a host key
    pinned as new. A Service is ours if it carries the token, or selects exactly what ours
    would (then it reaches nothing ours would not)."""
    token = manifest["metadata"]["annotations"][ANNOTATION_CREATE_TOKEN]
    if token and (found.metadata.annotations or {}).get(ANNOTATION_CREATE_TOKEN) == token:
        return None
    if kind == "pod":
        if found.metadata.uid in known_uids:
            return None
        return "it was not made by this launch (it lacks this create's token)"
    if (found.spec.selector or {}) == manifest["spec"]["selector"]:
        return None
    return f"it selects {found.spec.selector}, not {manifest['spec']['selector']}"


async def _create(api: KubeApi, context: str, kind: str, namespace: str,
                  manifest: dict[str, Any], managed_by: str,
                  known_uids: frozenset[str] = frozenset()) -> None:
    """Create one object; one of that name already there is adopted if it is ours."""
    name = manifest["metadata"]["name"]

    async def make(core: Any) -> Any:
        if kind == "pod":
            return await core.create_namespaced_pod(namespace, manifest)
        return await core.create_namespaced_service(namespace, manifest)

    async def read(core: Any) -> Any:
        if kind == "pod":
            return await core.read_namespaced_pod(name, namespace)
        return await core.read_namespaced_service(name, namespace)

    async def remove(core: Any) -> Any:
        return await core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)

    for _ in range(3):
        try:
            await api.call(context, make)
            return
        except ApiException as exc:  # 409: it is there (a create retried, or resumed)
            assert exc.status == 409
        try:
            found = await api.call(context, read)
        except ProvisionError as exc:
            if ": NotFound" not in exc.message:
                raise
            continue  # gone again since (deleted meanwhile): made anew
        owner = (found.metadata.labels or {}).get(LABEL_MANAGED_BY)
        if owner != managed_by:
            raise ProvisionError(
                f"kubernetes/{context}: a {kind} named {name} exists in namespace {namespace} "
                f"and is not this clusterd's ({LABEL_MANAGED_BY}: {owner})", BlockScope.FATAL,
                "launch the cluster under another name")
        why = _not_made_by(found, kind, manifest, known_uids)
        if why is not None:
            # Refused before anything reaches it: no SSH, no runtime, no token, no secrets.
            raise ProvisionError(
                f"kubernetes/{context}: refusing the {kind} {name} in namespace {namespace}: "
                f"{why}, though its labels say it is this clusterd's", BlockScope.FATAL,
                f"someone else made a {kind} under this cluster's name: find out who "
                f"(kubectl -n {namespace} get {kind} {name} -o yaml), or launch the cluster "
                "under another name")
        gone = lost(found) if kind == "pod" else None
        if gone is None:
            logger.info("adopted", kind=kind, name=name, context=context)
            return
        # A node lost (the pod ended, or its node stopped reporting): made again, as the
        # repair of a cluster that lost nodes asks.
        logger.info("replacing a lost pod", name=name, context=context, reason=gone)
        await api.call(context, remove)
        await _gone(api, context, namespace, name)
    raise ProvisionError(f"kubernetes/{context}: pod {name} keeps coming back",
                         BlockScope.REGION)


async def _gone(api: KubeApi, context: str, namespace: str, name: str) -> None:
    async def read(core: Any) -> Any:
        return await core.read_namespaced_pod(name, namespace)

    deadline = time.monotonic() + DELETE_TIMEOUT_S
    while time.monotonic() < deadline:
        try:
            await api.call(context, read)
        except ProvisionError as exc:
            if ": NotFound" in exc.message:
                return
            raise
        await anyio.sleep(POLL_S)
    raise ProvisionError(f"kubernetes/{context}: pod {name} is still there after "
                         f"{DELETE_TIMEOUT_S:.0f} s", BlockScope.REGION)


async def create(api: KubeApi, context: str, namespace: str, spec: PodSpec, num_nodes: int,
                 nodeport: bool, ports: list[tuple[int, int]],
                 known_uids: frozenset[str] = frozenset()) -> None:
    """Every object of the cluster: pods, their SSH Services (nodeport), the ports Service.
    known_uids: the pods the cluster has already (a repair), adopted as ours."""
    with first_error():
        async with anyio.create_task_group() as group:
            for index in range(num_nodes):
                group.start_soon(_create, api, context, "pod", namespace,
                                 pod_manifest(spec, index), spec.managed_by, known_uids)
                if nodeport:
                    group.start_soon(_create, api, context, "service", namespace,
                                     ssh_service_manifest(spec, pod_name(spec.cloud_name, index)),
                                     spec.managed_by)
            if ports:
                group.start_soon(_create, api, context, "service", namespace,
                                 ports_service_manifest(spec, ports), spec.managed_by)


def _ready(pod: Any) -> bool:
    return any(c.type == "Ready" and c.status == "True"
               for c in (pod.status.conditions if pod.status else None) or [])


def _unschedulable(pod: Any) -> str | None:
    for c in (pod.status.conditions if pod.status else None) or []:
        if c.type == "PodScheduled" and c.status == "False" and c.reason == "Unschedulable":
            return str(c.message or c.reason)
    return None


def _stuck(pod: Any) -> str | None:
    for status in (pod.status.container_statuses if pod.status else None) or []:
        waiting = status.state.waiting if status.state else None
        if waiting is not None and waiting.reason in STUCK:
            return f"{waiting.reason}: {waiting.message or ''}".strip(": ")
    return None


def ended(pod: Any) -> str | None:
    """Why the pod is gone for good (it failed, was evicted, or is being deleted), if so."""
    if pod.metadata.deletion_timestamp is not None:
        return "the pod is being deleted"
    phase = pod.status.phase if pod.status else None
    if phase in ("Failed", "Succeeded"):
        reason = pod.status.reason or phase
        message = pod.status.message or _terminated(pod) or "its container exited"
        if reason == "Evicted" and "ephemeral" in message.lower():
            # The kubelet's words are about containers and nodes; say what it means here.
            what = ("its node ran out of local disk" if "low on resource" in message.lower()
                    else "the pod wrote more than its ephemeral-storage limit allows")
            return (f"Evicted for local disk: {what} (the runtime, the workdir and the job's "
                    f"files count; raise kubernetes.ephemeral_storage and "
                    f"ephemeral_storage_limit, or put big files on a volume in pod_config): "
                    f"{message}")
        return f"{reason}: {message}"
    return None


def _terminated(pod: Any) -> str | None:
    """How the container ended, with its termination message (the start script's reason)."""
    for status in (pod.status.container_statuses if pod.status else None) or []:
        ended_ = status.state.terminated if status.state else None
        if ended_ is not None:
            said = (ended_.message or "").strip()
            return (f"its container exited with {ended_.exit_code}"
                    + (f": {said[-500:]}" if said else ""))
    return None


def node_lost(pod: Any) -> str | None:
    """Why the pod is lost with its node, if it is: the node controller marked a running pod
    not ready (the Ready condition False without a reason; the kubelet's own says
    ContainersNotReady), because its node stopped reporting."""
    if pod.status is None or pod.status.phase != "Running":
        return None
    ready = next((c for c in pod.status.conditions or [] if c.type == "Ready"), None)
    if ready is not None and ready.status == "False" and not ready.reason:
        return f"its node {pod.spec.node_name} stopped reporting (NotReady)"
    return None


def lost(pod: Any) -> str | None:
    """Why the pod is a node lost for good (ended, or on a node that stopped), if it is."""
    return ended(pod) or node_lost(pod)


async def wait_ready(api: KubeApi, context: str, namespace: str, cloud_name: str,
                     managed_by: str, num_nodes: int, provision_timeout_s: float,
                     timeout_s: float, autoscaler: str | None = None,
                     note: Callable[[str], Awaitable[None]] | None = None) -> list[Any]:
    """The cluster's pods once every one runs and is ready (head first). A pod the scheduler
    still cannot place after provision_timeout_s is capacity this context lacks (PLACEMENT,
    with the scheduler's message); with an autoscaler, that is the time it has to add a
    node, and `note` says once that the launch waits for it. A pod that fails, or whose
    image cannot be had, is an error of the context too."""
    started = time.monotonic()
    noted = False
    names = [pod_name(cloud_name, i) for i in range(num_nodes)]
    while True:
        listed = await api.call(context, lambda core: core.list_namespaced_pod(
            namespace, label_selector=selector(cloud_name, managed_by)))
        pods = {p.metadata.name: p for p in listed.items}
        missing = [n for n in names if n not in pods]
        if missing:
            raise ProvisionError(f"kubernetes/{context}: pod {missing[0]} is gone",
                                 BlockScope.REGION)
        for name in names:
            pod = pods[name]
            why = ended(pod) or _stuck(pod)
            if why:
                raise ProvisionError(f"kubernetes/{context}: pod {name}: {why}",
                                     BlockScope.REGION)
            unplaced = _unschedulable(pod)
            if unplaced and autoscaler and not noted and note is not None:
                noted = True
                await note(f"kubernetes/{context}: pod {name} waits for a node ({unplaced}); "
                           f"waiting up to {provision_timeout_s:.0f} s for the {autoscaler} "
                           "autoscaler to add one (kubernetes.autoscaler)")
            if unplaced and time.monotonic() - started > provision_timeout_s:
                raise ProvisionError(
                    f"kubernetes/{context}: pod {name} could not be scheduled within "
                    f"{provision_timeout_s:.0f} s"
                    + (f" (the {autoscaler} autoscaler added no node for it)"
                       if autoscaler else "") + f": {unplaced}", BlockScope.PLACEMENT,
                    "free capacity in the cluster, raise kubernetes.provision_timeout, or "
                    "let clusterd try elsewhere")
        if all(_ready(pods[n]) for n in names):
            return [pods[n] for n in names]
        if time.monotonic() - started > timeout_s:
            waiting = [n for n in names if not _ready(pods[n])]
            raise ProvisionError(f"kubernetes/{context}: pods {', '.join(waiting)} not ready "
                                 f"within {timeout_s:.0f} s", BlockScope.REGION)
        await anyio.sleep(POLL_S)


async def ssh_node_ports(api: KubeApi, context: str, namespace: str,
                         pods: list[str]) -> dict[str, int]:
    """The node port each pod's SSH Service was given."""
    out = {}
    for pod in pods:
        name = ssh_service_name(pod)

        async def read(core: Any, name: str = name) -> Any:
            return await core.read_namespaced_service(name, namespace)

        service = await api.call(context, read)
        out[pod] = int(service.spec.ports[0].node_port)
    return out


def recorded(pod: Any, node_port: int = 0) -> KubernetesPod:
    return KubernetesPod(pod.metadata.name, pod.status.pod_ip or "", pod.spec.node_name or "",
                         pod.status.host_ip or "", node_port, pod.metadata.uid or "")


async def list_ours(api: KubeApi, context: str, namespace: str, managed_by: str,
                    cloud_name: str | None = None) -> list[Any]:
    """Every pod of this daemon in the context's namespace (of one cluster, if named)."""
    listed = await api.call(context, lambda core: core.list_namespaced_pod(
        namespace, label_selector=selector(cloud_name, managed_by)))
    return list(listed.items)


def lifetime(pod: Any | None) -> tuple[float | None, float | None]:
    """When the pod started (`status.startTime`) and, once its containers have all ended,
    when the last one did (their `state.terminated.finishedAt`), in epoch seconds (None
    where the pod does not say): what the cost ledger dates a change by (NodeInfo)."""
    status = pod.status if pod is not None else None
    if status is None:
        return None, None
    started = _epoch(status.start_time)
    states = [c.state for c in status.container_statuses or []]
    ends = [end for s in states if s is not None and s.terminated is not None
            and (end := _epoch(s.terminated.finished_at)) is not None]
    # Every container ended, each with its time: else the pod's end is not known.
    return started, max(ends) if ends and len(ends) == len(states) else None


def _epoch(when: Any) -> float | None:
    """A time as kubernetes-asyncio gives it (a datetime; text from a raw object)."""
    if isinstance(when, str):
        try:
            when = datetime.datetime.fromisoformat(when.replace("Z", "+00:00"))
        except ValueError:
            return None
    if not isinstance(when, datetime.datetime):
        return None
    return (when if when.tzinfo else when.replace(tzinfo=datetime.UTC)).timestamp()


def node_status(pod: Any | None) -> tuple[NodeStatus, str]:
    """What a pod says of the node it is, and why (the pod's reason and message)."""
    if pod is None:
        return NodeStatus.TERMINATED, "the pod no longer exists"
    why = lost(pod)
    if why:
        return NodeStatus.TERMINATED, f"pod {pod.metadata.name}: {why}"
    phase = pod.status.phase if pod.status else None
    if phase == "Pending":
        return NodeStatus.PENDING, _unschedulable(pod) or _stuck(pod) or ""
    if not _ready(pod):
        # The node lifecycle controller marks the pods of a node that stopped reporting
        # NotReady, as does a probe that fails.
        condition = next((c for c in pod.status.conditions or [] if c.type == "Ready"), None)
        detail = (condition.message or condition.reason) if condition is not None else None
        return NodeStatus.UNREACHABLE, (f"pod {pod.metadata.name} on node "
                                        f"{pod.spec.node_name} is not ready"
                                        + (f" ({detail})" if detail else ""))
    return NodeStatus.RUNNING, ""


async def delete(api: KubeApi, context: str, namespace: str, cloud_name: str,
                 managed_by: str) -> None:
    """Remove every pod and Service of the cluster (of this daemon), and wait until the pods
    are gone. Idempotent."""
    chosen = selector(cloud_name, managed_by)
    await api.call(context, lambda core: core.delete_collection_namespaced_pod(
        namespace, label_selector=chosen, grace_period_seconds=0))
    services = await api.call(context, lambda core: core.list_namespaced_service(
        namespace, label_selector=chosen))
    for service in services.items:
        name = service.metadata.name

        async def remove(core: Any, name: str = name) -> Any:
            return await core.delete_namespaced_service(name, namespace)

        try:
            await api.call(context, remove)
        except ProvisionError as exc:
            if ": NotFound" not in exc.message:  # gone already is what we want
                raise
    deadline = time.monotonic() + DELETE_TIMEOUT_S
    while await list_ours(api, context, namespace, managed_by, cloud_name):
        if time.monotonic() > deadline:
            raise ProvisionError(f"kubernetes/{context}: the pods of {cloud_name} are still "
                                 f"there after {DELETE_TIMEOUT_S:.0f} s", BlockScope.FATAL,
                                 "run `clusterctl down` again later")
        await anyio.sleep(POLL_S)
