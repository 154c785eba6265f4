"""The `kubernetes` provider: clusters of pods, one per node, through kubernetes-asyncio.

Each allowed kubeconfig context is a region for failover (`kubernetes.allowed_contexts`, else
the current context), and the cluster's pods live in that context's namespace. A pod asks for
the task's CPUs, memory and GPUs (`nvidia.com/gpu`, on a node labelled with the GPU model), runs
the configured node image (or the task's `image_id: docker:IMAGE`), and lets the daemon's key in
over SSH: through a port-forward the daemon serves over the API server (the default, as
SkyPilot's), or a NodePort Service per pod (`networking_mode: nodeport`). Pods cannot be
stopped: `stop` is refused, and autostop means down.
"""

from __future__ import annotations

import dataclasses
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio
import anyio.abc

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import first_error
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus, SSHTarget
from clusterd.pod_config import PodConfigError
from clusterd.providers.base import (
    BlockScope,
    ClusterRequest,
    ForeignReport,
    Orphan,
    Placement,
    ProviderContext,
    ProviderDefaults,
    ProviderOf,
    ProvisionError,
)
from clusterd.providers.kubernetes import gpu_labels, nodeport, pods
from clusterd.providers.kubernetes.api import KubeApi, read_contexts
from clusterd.providers.kubernetes.capacity import NodeCapacity, capacities, nearest
from clusterd.providers.kubernetes.handle import KubernetesHandle, KubernetesPod
from clusterd.providers.kubernetes.manifests import (
    LABEL_CLOUD_NAME,
    PodSpec,
    pod_manifest,
    pod_name,
)
from clusterd.providers.kubernetes.portforward import PodPort, PortForwards
from clusterd.providers.ports import port_ranges
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.keys import DaemonKey
from clusterd.user_config import KubernetesConfig, UserConfig

logger = log.get("clusterd.kubernetes")

DEFAULT_CPUS = 2.0  # SkyPilot's default pod on Kubernetes: 2 CPUs, 8 GB
DEFAULT_MEMORY_GB = 8.0
SSH_ATTEMPT_S = 20.0
CHECK_TIMEOUT_S = 15.0
# The pods' image where the config names none: a setting of the daemon's environment, so a
# machine (a test bed, a CI runner) can give every daemon started there its image.
# Where neither names one: Python's official slim image (Debian) of the daemon's own minor,
# which clusterd's runtime needs; the pod's start script installs sshd, rsync and sudo.
DEFAULT_IMAGE = f"docker.io/library/python:{sys.version_info.major}.{sys.version_info.minor}-slim"


class KubernetesProvider(ProviderDefaults[KubernetesHandle]):
    name: ClassVar[str] = "kubernetes"
    skypilot_cloud: ClassVar[str] = "Kubernetes"
    can_stop: ClassVar[bool] = False
    autostop_tears_down: ClassVar[bool] = True
    terminate_discards_nodes: ClassVar[bool] = True
    keeps_node_times: ClassVar[bool] = True
    honoured_fields: ClassVar[frozenset[str]] = frozenset({
        "resources.ports", "resources.image_id", "resources.labels", "config"})

    def __init__(self, config: Callable[[], UserConfig], connections: SSHConnections,
                 key: DaemonKey, managed_by: str, runtime_dir: Path,
                 on_note: ForeignReport | None = None, default_image: str = "") -> None:
        self._on_note = on_note
        # Below the config's image: the settings' CLUSTERD_KUBERNETES_IMAGE (a test bed's).
        self._default_image = default_image.strip()
        self._config = config
        self._connections = connections
        self._key = key
        self.managed_by = managed_by
        self.api = KubeApi(runtime_dir / "kubernetes" / "tmp")
        self.forwards = PortForwards(runtime_dir / "kubernetes" / "pf", self._open_forward)

    @classmethod
    def build(cls, context: ProviderContext) -> KubernetesProvider:
        return cls(context.config, context.connections, DaemonKey(context.state_dir / "ssh"),
                   context.daemon_id, context.runtime_dir, context.on_note,
                   context.settings.kubernetes_image)

    def _k8s(self) -> KubernetesConfig:
        return self._config().kubernetes

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """The port-forwards, served for the daemon's lifetime."""
        await self.forwards.run(task_status=task_status)

    async def _open_forward(self, target: PodPort) -> Any:
        return self.api.portforward(target.context, target.namespace, target.pod, target.port)

    # -- contexts ---------------------------------------------------------------------------

    def contexts(self) -> dict[str, str]:
        """{context: namespace} of the contexts clusterd may use, in preference order."""
        try:
            found, current = read_contexts()
        except Exception as exc:  # a kubeconfig that cannot be read: none usable
            raise ProvisionError(f"kubernetes: the kubeconfig cannot be read: {exc}",
                                 BlockScope.PROVIDER, "check KUBECONFIG or ~/.kube/config"
                                 ) from None
        by_name = {c.name: c.namespace for c in found}
        allowed = self._k8s().allowed_contexts
        names = list(allowed) if allowed else ([current] if current else [])
        return {n: by_name[n] for n in names if n in by_name}

    def _namespace(self, context: str) -> str:
        namespace = self.contexts().get(context)
        if namespace is None:
            raise ProvisionError(f"kubernetes: context {context!r} is not one clusterd may "
                                 "use", BlockScope.REGION,
                                 "add it to kubernetes.allowed_contexts in the config")
        return namespace

    # -- placements -------------------------------------------------------------------------

    def _asked(self, request: ClusterRequest) -> tuple[float, float, float, str | None]:
        resources = request.resources
        cpus = resources.cpus if resources.cpus is not None else DEFAULT_CPUS
        memory = resources.memory_gb if resources.memory_gb is not None else DEFAULT_MEMORY_GB
        gpus = resources.accelerator_count if resources.accelerator else 0.0
        return cpus, memory, gpus, resources.accelerator

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        cpus, memory, gpus, accelerator = self._asked(request)
        contexts = self.contexts()
        wanted = request.resources.infra.region
        if wanted:
            if wanted not in contexts:
                raise ProvisionError(f"kubernetes: context {wanted!r} is not one clusterd may "
                                     "use", BlockScope.PROVIDER,
                                     f"allowed: {', '.join(contexts) or 'none'} "
                                     "(kubernetes.allowed_contexts)")
            contexts = {wanted: contexts[wanted]}
        if not contexts:
            raise ProvisionError("kubernetes: no kubeconfig context to use", BlockScope.PROVIDER,
                                 "set KUBECONFIG, or kubernetes.allowed_contexts")
        kind = f"{_n(cpus)}CPU--{_n(memory)}GB" + (f"--{_n(gpus)}{accelerator}" if gpus else "")
        nodes: dict[str, list[NodeCapacity] | None] = {}

        async def look(context: str) -> None:
            try:
                nodes[context] = await self._capacities(context, contexts[context])
            except ProvisionError as exc:
                if exc.scope == BlockScope.PROVIDER:
                    raise
                # The create there fails the same way, and failover says so in its table.
                logger.info("cannot read the context's capacity", context=context,
                            error=exc.message)
                nodes[context] = None

        with first_error():
            async with anyio.create_task_group() as group:
                for context in contexts:
                    group.start_soon(look, context)
        placements, seen = [], []
        autoscaler = self._k8s().autoscaler
        # Every context is priced alike (`kubernetes.pricing`), so their order is kept.
        price, _ = self._k8s().pricing.pod_per_hour(cpus, memory, accelerator, gpus)
        for context in contexts:
            found = nodes.get(context)
            # With an autoscaler, a node that can hold the pod may be one it adds.
            fits = found is None or autoscaler is not None or any(
                n.ready and n.schedulable and n.holds(cpus, memory, gpus, accelerator)
                for n in found)
            if fits:
                placements.append(Placement("kubernetes", context, None, kind, cpus, memory,
                                            accelerator, gpus, price, False))
            elif found:
                seen += found
        if not placements:
            named = "; ".join(n.describe() for n in nearest(seen, gpus)) or "no nodes"
            raise ProvisionError(
                f"kubernetes: no node can hold a pod of {cpus:g} CPUs, {memory:g} GB"
                + (f", {gpus:g} {accelerator}" if gpus else "") + f"; the nearest: {named}",
                BlockScope.PROVIDER, "ask for less, or add nodes that can hold it")
        return placements

    async def _capacities(self, context: str, namespace: str) -> list[NodeCapacity] | None:
        """The context's nodes, with what the pods this user can see take of them; None when
        the context's user may not read nodes (then the scheduler decides)."""
        try:
            listed = await self.api.call(context, lambda core: core.list_node())
        except ProvisionError as exc:
            if exc.scope == BlockScope.PROVIDER:
                raise
            logger.info("cannot read the context's nodes", context=context, error=exc.message)
            return None
        try:
            in_use = await self.api.call(context, lambda core: core.list_pod_for_all_namespaces())
        except ProvisionError:  # may read nodes, not every namespace's pods: its own then
            in_use = await self.api.call(context, lambda core: core.list_namespaced_pod(
                namespace))
        return capacities(listed.items, in_use.items)

    # -- create / wait ----------------------------------------------------------------------

    def _image(self, request: ClusterRequest) -> str:
        image_id = request.resources.image_id or ""
        if image_id.startswith("docker:"):
            return image_id.removeprefix("docker:")
        if image_id:
            raise ProvisionError(f"resources.image_id: {image_id!r} is no container image; "
                                 "on Kubernetes it is docker:IMAGE", BlockScope.FATAL)
        return self._k8s().image or self._default_image or DEFAULT_IMAGE

    async def create(self, request: ClusterRequest, placement: Placement) -> KubernetesHandle:
        context = placement.region or ""
        namespace = self._namespace(context)
        config = self._k8s()
        cpus, memory, gpus, accelerator = self._asked(request)
        pair = await anyio.to_thread.run_sync(self._key.ensure)
        selector = None
        if gpus and accelerator:
            nodes = await self._capacities(context, namespace)
            selector = gpu_labels.selector_for(
                accelerator, None if nodes is None else
                [n.gpu_label for n in nodes if n.gpu_label], config.autoscaler)
        spec = PodSpec(request.cloud_name, request.name, self.managed_by, self._image(request),
                       config.image_pull_policy, pair.public_openssh.strip(), cpus, memory,
                       gpus, accelerator, request.resources.labels, request.create_token,
                       selector, config.ephemeral_storage, config.ephemeral_storage_limit,
                       tuple(f for f in (config.pod_config, request.resources.pod_config) if f),
                       config.ssh_user)
        try:
            pod_manifest(spec, 0)  # a pod_config clashing with clusterd's names: say so now
        except PodConfigError as exc:
            raise ProvisionError(f"kubernetes: {exc}", BlockScope.FATAL,
                                 "fix the pod_config (config file, or the task's config:)"
                                 ) from None
        nodeport = config.networking_mode == "nodeport"
        previous = request.previous
        known = frozenset(p.uid for p in previous.pods if p.uid) if isinstance(
            previous, KubernetesHandle) and previous.context == context else frozenset()
        try:
            await pods.create(self.api, context, namespace, spec, request.num_nodes, nodeport,
                              port_ranges(request.resources.ports), known)
        except BaseException:
            # Nothing of a failed attempt stays behind (the next one goes elsewhere).
            with anyio.CancelScope(shield=True), anyio.move_on_after(120):
                await pods.delete(self.api, context, namespace, request.cloud_name,
                                  self.managed_by)
            raise
        names = [pod_name(request.cloud_name, i) for i in range(request.num_nodes)]
        return KubernetesHandle(context, namespace, config.networking_mode, config.ssh_user,
                                cpus, memory, gpus, accelerator,
                                tuple(KubernetesPod(n) for n in names))

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> KubernetesHandle:
        """Where the launch was making pods (the intent's region is its context), no pods."""
        context = (intent.region or "") if intent is not None else ""
        return KubernetesHandle(context, self.contexts().get(context, "") if context else "")

    async def wait(self, cloud_name: str, handle: KubernetesHandle,
                   timeout_s: float) -> KubernetesHandle:
        """Every pod scheduled, running and ready, with its address; then SSH answers."""
        config = self._k8s()

        async def note(text: str) -> None:
            logger.info("provider note", cluster=cloud_name, text=text)
            if self._on_note is not None:
                await self._on_note(cloud_name, text)

        ready = await pods.wait_ready(self.api, handle.context, handle.namespace, cloud_name,
                                      self.managed_by, len(handle.pods),
                                      config.provision_timeout_s, timeout_s,
                                      config.autoscaler, note)
        ports = (await pods.ssh_node_ports(self.api, handle.context, handle.namespace,
                                           [p.metadata.name for p in ready])
                 if handle.networking == "nodeport" else {})
        recorded = [pods.recorded(p, ports.get(p.metadata.name, 0)) for p in ready]
        if handle.networking == "nodeport":
            recorded = [await self._reachable_node(handle.context, p) for p in recorded]
        handle = dataclasses.replace(handle, pods=tuple(recorded))
        info = await self.cluster_info(cloud_name, handle)
        with anyio.fail_after(timeout_s):
            await self._connections.wait_reachable(
                [node.ssh for node in info.nodes if node.ssh is not None],
                attempt_s=SSH_ATTEMPT_S, first_delay_s=0.5, max_delay_s=5.0)
        return handle

    # -- reach ------------------------------------------------------------------------------

    async def _reachable_node(self, context: str, pod: KubernetesPod) -> KubernetesPod:
        """The pod, with the address of its node that the daemon reaches its SSH node port
        on (nodeport mode); refused, saying what was tried, when none answers."""
        async def read(core: Any) -> Any:
            return await core.read_node(pod.node)

        try:
            node = await self.api.call(context, read)
        except ProvisionError as exc:  # may not read nodes: the pod's hostIP is all we know
            if exc.scope == BlockScope.PROVIDER:
                raise
            node = None
        address, tried = await nodeport.reachable(
            nodeport.node_addresses(node, pod.host_ip), pod.ssh_node_port)
        if address is None:
            raise ProvisionError(
                f"kubernetes/{context}: networking_mode nodeport cannot reach node {pod.node} "
                f"from here (use portforward): "
                f"{'; '.join(tried) or 'the node lists no address'}", BlockScope.REGION,
                "the nodes' addresses do not route from here (private nodes, a firewall): "
                "use networking_mode: portforward (the default; it goes through the API "
                "server), or run clusterd where the nodes' network is reachable")
        return dataclasses.replace(pod, host_ip=address)

    async def _target(self, handle: KubernetesHandle, pod: KubernetesPod) -> SSHTarget:
        user = handle.ssh_user or self._k8s().ssh_user
        identity = str(self._key.ensure().private_path)
        # Keyed by the pod's uid: a pod made again under the same name (a lost node
        # repaired) is a new machine with a new host key, not an impersonator.
        alias = (f"k8s-pod-{pod.uid}" if pod.uid
                 else f"k8s/{handle.context}/{handle.namespace}/{pod.name}")
        if handle.networking == "nodeport":
            return SSHTarget(pod.host_ip, pod.ssh_node_port, user, identity, alias)
        path = await self.forwards.ensure(PodPort(handle.context, handle.namespace, pod.name))
        proxy = shlex.join([sys.executable, "-m", "clusterd.ssh.unix_connect", str(path)])
        return SSHTarget(pod.name, 22, user, identity, alias, proxy)

    def _node(self, cloud_name: str, handle: KubernetesHandle, pod: KubernetesPod,
              status: NodeStatus, reason: str, target: SSHTarget | None) -> NodeInfo:
        return NodeInfo(node_id=pod.name, internal_ip=pod.ip, status=status, ssh=target,
                        runtime_dir=f"~/.clusterd/clusters/{cloud_name}", workdir="~/sky_workdir",
                        cpus=handle.cpus, gpus=handle.gpus, reason=reason)

    async def cluster_info(self, cloud_name: str, handle: KubernetesHandle) -> ClusterInfo:
        if handle.pods and handle.context and any(not p.ip for p in handle.pods):
            # Recorded before the pods ran (a launch that failed after its create): ask.
            live = {p.metadata.name: p for p in await pods.list_ours(
                self.api, handle.context, handle.namespace, self.managed_by, cloud_name)}
            handle = dataclasses.replace(handle, pods=tuple(
                pods.recorded(live[p.name], p.ssh_node_port)
                if not p.ip and p.name in live and live[p.name].status.pod_ip else p
                for p in handle.pods))
        if not handle.pods or any(not p.ip for p in handle.pods):
            raise ProvisionError(f"{cloud_name} has no running pods recorded", BlockScope.FATAL)
        nodes = [self._node(cloud_name, handle, p, NodeStatus.RUNNING, "",
                            await self._target(handle, p)) for p in handle.pods]
        return ClusterInfo(tuple(nodes))

    # -- what exists ------------------------------------------------------------------------

    async def query(self, cloud_name: str, handle: KubernetesHandle) -> list[NodeInfo]:
        result = (await self.query_many([(cloud_name, handle)]))[cloud_name]
        if isinstance(result, ProvisionError):
            raise result
        return result

    async def query_many(
        self, clusters: list[tuple[str, KubernetesHandle]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        """One pod list per context and namespace, for all of this daemon's clusters there."""
        by_place: dict[tuple[str, str], list[tuple[str, KubernetesHandle]]] = {}
        for cloud_name, handle in clusters:
            by_place.setdefault((handle.context, handle.namespace), []).append(
                (cloud_name, handle))
        found: dict[str, list[NodeInfo] | ProvisionError] = {}

        async def one(place: tuple[str, str], members: list[tuple[str, KubernetesHandle]]
                      ) -> None:
            context, namespace = place
            if not context:  # a launch that never chose a context made nothing
                found.update({name: [] for name, _ in members})
                return
            try:
                listed = await pods.list_ours(self.api, context, namespace, self.managed_by)
            except ProvisionError as exc:
                found.update({name: exc for name, _ in members})
                return
            by_name = {p.metadata.name: p for p in listed}
            for cloud_name, handle in members:
                recorded = {p.name for p in handle.pods}
                live = [p for p in listed
                        if (p.metadata.labels or {}).get(LABEL_CLOUD_NAME) == cloud_name]
                names = [p.name for p in handle.pods] + sorted(
                    p.metadata.name for p in live if p.metadata.name not in recorded)
                infos = []
                for name in names:
                    pod = by_name.get(name)
                    status, reason = pods.node_status(pod)
                    if pod is None:
                        reason = f"pod {name} no longer exists"
                    kept = next((p for p in handle.pods if p.name == name), None)
                    record = pods.recorded(pod) if pod is not None and pod.status.pod_ip \
                        else kept or KubernetesPod(name)
                    launched, stopped = pods.lifetime(pod)
                    infos.append(dataclasses.replace(
                        self._node(cloud_name, handle, record, status, reason, None),
                        launched_at=launched, stopped_at=stopped))
                found[cloud_name] = infos

        async with anyio.create_task_group() as group:
            for place, members in by_place.items():
                group.start_soon(one, place, members)
        return found

    # -- stop / start / terminate -----------------------------------------------------------

    async def stop(self, cloud_name: str, handle: KubernetesHandle) -> None:
        raise ProtocolError(ErrorCode.UNSUPPORTED, "Kubernetes pods cannot be stopped",
                            "tear the cluster down instead: clusterctl down (autostop on "
                            "Kubernetes tears down)")

    async def start(self, cloud_name: str, handle: KubernetesHandle) -> KubernetesHandle:
        raise ProtocolError(ErrorCode.UNSUPPORTED, "Kubernetes pods cannot be stopped or "
                            "started", "launch the cluster again: clusterctl launch -c NAME")

    async def terminate(self, cloud_name: str, handle: KubernetesHandle) -> None:
        if not handle.context:
            return
        await pods.delete(self.api, handle.context, handle.namespace or
                          self._namespace(handle.context), cloud_name, self.managed_by)
        await self.forwards.close(lambda t: not t.pod.startswith(f"{cloud_name}-"))

    async def open_ports(self, cloud_name: str, handle: KubernetesHandle,
                         ports: tuple[str, ...]) -> None:
        return None  # the ports Service is made with the pods

    # -- check ------------------------------------------------------------------------------

    async def enabled(self) -> bool:
        try:
            return bool(self.contexts())
        except ProvisionError:
            return False

    async def check(self) -> dict[str, Any]:
        try:
            contexts = self.contexts()
        except ProvisionError as exc:
            return {"ok": False, "detail": exc.message, "hint": exc.hint}
        if not contexts:
            return {"ok": False, "detail": "no kubeconfig context (KUBECONFIG, "
                    "~/.kube/config; kubernetes.allowed_contexts)"}
        rows: list[dict[str, Any]] = []

        async def one(context: str, namespace: str) -> None:
            row: dict[str, Any] = {"context": context, "namespace": namespace}
            try:
                with anyio.fail_after(CHECK_TIMEOUT_S):
                    nodes = await self._capacities(context, namespace)
                row["ok"] = True
                if nodes is not None:
                    row["nodes"] = len(nodes)
                    row["ready"] = sum(1 for n in nodes if n.ready)
                    row["gpus"] = {a: sum(n.gpus for n in nodes if n.accelerator == a)
                                   for a in sorted({n.accelerator for n in nodes
                                                    if n.accelerator})}
            except (ProvisionError, TimeoutError) as exc:
                row["ok"] = False
                row["error"] = getattr(exc, "message", None) or "no answer within " \
                    f"{CHECK_TIMEOUT_S:.0f} s"
            rows.append(row)

        async with anyio.create_task_group() as group:
            for context, namespace in contexts.items():
                group.start_soon(one, context, namespace)
        rows.sort(key=lambda r: list(contexts).index(r["context"]))
        good = [r for r in rows if r["ok"]]
        detail = ", ".join(
            f"{r['context']} ({r.get('ready', '?')} of {r.get('nodes', '?')} nodes ready"
            + "".join(f", {_n(c)} {a}" for a, c in (r.get("gpus") or {}).items()) + ")"
            if r["ok"] else f"{r['context']}: {r['error']}" for r in rows)
        return {"ok": bool(good), "detail": detail, "contexts": rows}

    async def accelerators(self) -> GpuNodes | None:
        """The GPU nodes of every allowed context, with what is free on each now; a context
        that does not answer (or whose user may not read nodes) is left out."""
        try:
            contexts = self.contexts()
        except ProvisionError:
            return None
        if not contexts:
            return None
        found: dict[str, list[NodeCapacity]] = {}

        async def one(context: str, namespace: str) -> None:
            with anyio.move_on_after(CHECK_TIMEOUT_S):
                try:
                    found[context] = await self._capacities(context, namespace) or []
                except ProvisionError as exc:
                    logger.info("no GPUs read", context=context, error=exc.message)

        async with anyio.create_task_group() as group:
            for context, namespace in contexts.items():
                group.start_soon(one, context, namespace)
        return GpuNodes([(context, node) for context in contexts
                         for node in found.get(context, []) if node.accelerator and node.gpus])

    async def aclose(self) -> None:
        await self.api.aclose()

    # -- orphans ----------------------------------------------------------------------------

    async def orphans(self, known: Callable[[], set[str]]) -> list[Orphan]:
        found: dict[tuple[str, str], list[str]] = {}

        async def one(context: str, namespace: str) -> None:
            try:
                listed = await pods.list_ours(self.api, context, namespace, self.managed_by)
            except ProvisionError as exc:  # looked for again on the next cycle
                logger.info("cannot look for orphans", context=context, error=exc.message)
                return
            for pod in listed:
                name = (pod.metadata.labels or {}).get(LABEL_CLOUD_NAME) or "?"
                found.setdefault((context, name), []).append(pod.metadata.name)

        async with anyio.create_task_group() as group:
            for context, namespace in self.contexts().items():
                group.start_soon(one, context, namespace)
        recorded = known()
        return [Orphan(self.name, context, cloud_name, tuple(sorted(names)))
                for (context, cloud_name), names in sorted(found.items())
                if cloud_name not in recorded]

    async def remove_orphan(self, orphan: Orphan) -> None:
        context = orphan.region or ""
        await pods.delete(self.api, context, self._namespace(context), orphan.cloud_name,
                          self.managed_by)


class GpuNodes:
    """`show-gpus` of Kubernetes: one row per GPU node (a context is its region), with its
    total and free accelerators."""

    def __init__(self, nodes: list[tuple[str, NodeCapacity]]) -> None:
        self._nodes = nodes

    def accelerator_rows(self, name: str | None = None) -> list[dict[str, object]]:
        return [{"accelerator": node.accelerator, "count": node.gpus, "free": node.free_gpus,
                 "node": node.name, "region": context, "vcpus": node.cpus,
                 "memory_gb": round(node.memory_gb, 1), "ready": node.ready,
                 "regions": [context], "instance_type": None, "price": None,
                 "spot_price": None}
                for context, node in self._nodes
                if name is None or (node.accelerator or "").lower() == name.lower()]

    def accelerator_names(self) -> list[str]:
        return sorted({node.accelerator for _, node in self._nodes if node.accelerator})


def _n(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else f"{value:g}"


# mypy checks here that the class is a provider of its own handles, whole.
_PROVIDER: type[ProviderOf[KubernetesHandle]] = KubernetesProvider
