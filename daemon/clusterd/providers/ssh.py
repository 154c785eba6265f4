"""The `ssh` provider: clusters on hosts you already have, from `ssh_node_pools.yaml`.

A launch takes free hosts from its pool; a host in use by one cluster is not given to another
until that cluster is torn down. These machines are not ours: they cannot be stopped, and
"terminate" only hands them back to the pool (the runtime layer removes what we put there).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.concurrency import first_error
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus, SSHTarget
from clusterd.providers.base import (
    BlockScope,
    ClusterRequest,
    Placement,
    ProviderContext,
    ProviderDefaults,
    ProviderHandle,
    ProviderOf,
    ProvisionError,
)
from clusterd.providers.ssh_pools import Pool, load_pools
from clusterd.ssh.connections import SSHConnections

# Every host of every ssh cluster the daemon knows, by the cluster that holds it.
HostsInUse = Callable[[], dict[SSHTarget, str]]
PROBE = "nproc; awk '/MemTotal/ {print $2}' /proc/meminfo"
REACH_TIMEOUT_S = 10.0


@dataclasses.dataclass(frozen=True)
class SSHHost:
    """A host a cluster holds, with what it had when it was taken."""

    target: SSHTarget
    cpus: float = 0
    memory_gb: float = 0

    def to_json(self) -> dict[str, Any]:
        return {**self.target.to_json(), "cpus": self.cpus, "memory_gb": self.memory_gb}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SSHHost:
        return cls(SSHTarget.from_json(data), data.get("cpus", 0), data.get("memory_gb", 0))


@dataclasses.dataclass(frozen=True)
class SSHHandle(ProviderHandle, provider="ssh"):
    pool: str | None  # None: no pool was chosen (a launch that never got hosts)
    hosts: tuple[SSHHost, ...] = ()  # the head first

    def to_json(self) -> dict[str, Any]:
        return {"pool": self.pool, "hosts": [h.to_json() for h in self.hosts]}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> SSHHandle:
        return cls(data.get("pool"), tuple(SSHHost.from_json(h) for h in data.get("hosts", [])))

    def held_hosts(self) -> tuple[SSHTarget, ...]:
        return tuple(h.target for h in self.hosts)


class SSHProvider(ProviderDefaults[SSHHandle]):
    name: ClassVar[str] = "ssh"
    skypilot_cloud: ClassVar[str] = "SSH"
    can_stop: ClassVar[bool] = False
    check_top_level: ClassVar[tuple[str, ...]] = ("pools_file", "hosts")

    def __init__(self, pools_path: Path, connections: SSHConnections,
                 hosts_in_use: HostsInUse) -> None:
        self.pools_path = pools_path
        self._connections = connections
        self._hosts_in_use = hosts_in_use
        # Hosts handed to a launch whose record may not hold them yet: (name, cloud name).
        self._reserved: dict[SSHTarget, tuple[str, str]] = {}
        self._choosing = anyio.Lock()

    @classmethod
    def build(cls, context: ProviderContext) -> SSHProvider:
        def in_use() -> dict[SSHTarget, str]:
            return {host: name for name, handle in context.recorded(cls.name)
                    for host in handle.held_hosts()}

        return cls(context.config_dir / "ssh_node_pools.yaml", context.connections, in_use)

    def pools(self) -> dict[str, Pool]:
        return load_pools(self.pools_path)

    def _pool(self, name: str | None) -> Pool:
        pools = self.pools()
        if not pools:
            raise ProvisionError(f"no ssh node pools are defined in {self.pools_path}",
                                 BlockScope.PROVIDER,
                                 "write one (see docs/providers.md), then retry")
        if name is None:
            if len(pools) == 1:
                return next(iter(pools.values()))
            raise ProvisionError(f"name a pool: --infra ssh/POOL (pools: {', '.join(pools)})",
                                 BlockScope.FATAL)
        if name not in pools:
            raise ProvisionError(f"there is no ssh node pool {name!r} in {self.pools_path}",
                                 BlockScope.FATAL, f"pools: {', '.join(pools) or 'none'}")
        return pools[name]

    def _taken(self) -> dict[SSHTarget, str]:
        return {**self._hosts_in_use(), **{h: name for h, (name, _) in self._reserved.items()}}

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        pool = self._pool(request.resources.infra.region)
        taken = self._taken()
        free = [h for h in pool.hosts if h not in taken]
        if len(free) < request.num_nodes:
            holders = sorted({taken[h] for h in pool.hosts if h in taken})
            raise ProvisionError(
                f"pool {pool.name} has {len(free)} free host(s) of {len(pool.hosts)}; the task "
                f"needs {request.num_nodes}",
                BlockScope.FATAL,
                f"in use by: {', '.join(holders)}" if holders else "add hosts to the pool",
            )
        return [Placement("ssh", pool.name, None, None, cpus=0, memory_gb=0,
                          price_per_hour=pool.price_per_hour)]

    async def create(self, request: ClusterRequest, placement: Placement) -> SSHHandle:
        async with self._choosing:
            pool = self._pool(placement.region)
            taken = self._taken()
            chosen = [h for h in pool.hosts if taken.get(h) in (None, request.name)]
            chosen = chosen[: request.num_nodes]
            if len(chosen) < request.num_nodes:
                raise ProvisionError(f"pool {pool.name} no longer has {request.num_nodes} free "
                                     "hosts", BlockScope.FATAL)
            for host in chosen:
                self._reserved[host] = (request.name, request.cloud_name)
        try:
            facts = await self._probe_all(chosen)
        except BaseException:
            self._release(request.cloud_name)
            raise
        wanted = request.resources
        for host, (cpus, memory_gb) in zip(chosen, facts, strict=True):
            if wanted.cpus is not None and cpus < wanted.cpus:
                self._release(request.cloud_name)
                raise ProvisionError(
                    f"{host.host} has {cpus:g} CPUs; the task asks for {wanted.cpus:g}",
                    BlockScope.FATAL)
            if wanted.memory_gb is not None and memory_gb < wanted.memory_gb:
                self._release(request.cloud_name)
                raise ProvisionError(
                    f"{host.host} has {memory_gb:.1f} GB of memory; the task asks for "
                    f"{wanted.memory_gb:g}", BlockScope.FATAL)
        return SSHHandle(pool.name, tuple(
            SSHHost(h, cpus, round(mem, 1)) for h, (cpus, mem) in zip(chosen, facts, strict=True)))

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> SSHHandle:
        return SSHHandle(None)  # no pool chosen, no hosts taken

    async def _probe_all(self, hosts: list[SSHTarget]) -> list[tuple[float, float]]:
        facts: list[tuple[float, float]] = [(0.0, 0.0)] * len(hosts)

        async def probe(index: int, host: SSHTarget) -> None:
            done = await self._connections.run(host, PROBE, timeout_s=REACH_TIMEOUT_S * 3)
            lines = done.text.split()
            if done.exit_code != 0 or len(lines) < 2:
                raise ProvisionError(f"{host.host}: cannot read its CPUs and memory",
                                     BlockScope.FATAL)
            facts[index] = (float(lines[0]), int(lines[1]) / 1024**2)

        with first_error():
            async with anyio.create_task_group() as group:
                for index, host in enumerate(hosts):
                    group.start_soon(probe, index, host)
        return facts

    def _release(self, cloud_name: str) -> None:
        for host in [h for h, (_, owner) in self._reserved.items() if owner == cloud_name]:
            del self._reserved[host]


    def _nodes(self, cloud_name: str, handle: SSHHandle,
               statuses: list[NodeStatus]) -> list[NodeInfo]:
        return [
            NodeInfo(
                node_id=f"{host.target.host}:{host.target.port}",
                internal_ip=host.target.host,
                status=status,
                ssh=host.target,
                runtime_dir=f"~/.clusterd/clusters/{cloud_name}",
                workdir="~/sky_workdir",
                cpus=float(host.cpus or 1),
            )
            for host, status in zip(handle.hosts, statuses, strict=True)
        ]

    async def query(self, cloud_name: str, handle: SSHHandle) -> list[NodeInfo]:
        result = (await self.query_many([(cloud_name, handle)]))[cloud_name]
        if isinstance(result, ProvisionError):
            raise result
        return result

    async def query_many(
        self, clusters: list[tuple[str, SSHHandle]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        """Each host is reached once, however many clusters ask (a host has one cluster,
        but a refresh may list a cluster twice)."""
        targets = {target for _, handle in clusters for target in handle.held_hosts()}
        reachable: dict[SSHTarget, bool] = {}

        async def reach(target: SSHTarget) -> None:
            try:
                with anyio.fail_after(REACH_TIMEOUT_S * 3):
                    await self._connections.get(target)
                reachable[target] = True
            except (ProtocolError, TimeoutError):
                reachable[target] = False

        async with anyio.create_task_group() as group:
            for target in targets:
                group.start_soon(reach, target)
        return {
            name: self._nodes(name, handle, [
                NodeStatus.RUNNING if reachable.get(target) else NodeStatus.UNREACHABLE
                for target in handle.held_hosts()
            ])
            for name, handle in clusters
        }

    async def cluster_info(self, cloud_name: str, handle: SSHHandle) -> ClusterInfo:
        if not handle.hosts:
            raise ProvisionError(f"{cloud_name} holds no hosts", BlockScope.FATAL)
        return ClusterInfo(tuple(self._nodes(cloud_name, handle,
                                             [NodeStatus.RUNNING] * len(handle.hosts))))

    async def stop(self, cloud_name: str, handle: SSHHandle) -> None:
        raise ProtocolError(ErrorCode.UNSUPPORTED, "ssh hosts cannot be stopped by clusterd")

    async def start(self, cloud_name: str, handle: SSHHandle) -> SSHHandle:
        return handle

    async def terminate(self, cloud_name: str, handle: SSHHandle) -> None:
        self._release(cloud_name)  # the hosts go back to the pool with the record

    async def enabled(self) -> bool:
        try:
            return bool(self.pools())
        except ProtocolError:
            return False

    async def check(self) -> dict[str, Any]:
        try:
            hosts = await self.check_hosts()
        except ProtocolError as exc:
            return {"ok": False, "detail": exc.message, "pools_file": str(self.pools_path),
                    "hosts": []}
        if not hosts:
            return {"ok": False, "detail": f"no node pools in {self.pools_path}",
                    "pools_file": str(self.pools_path), "hosts": []}
        answering = sum(1 for h in hosts if h["ok"])
        pools = len({h["pool"] for h in hosts})
        return {"ok": answering > 0,
                "detail": f"{pools} pool(s), {answering} of {len(hosts)} host(s) answer",
                "pools_file": str(self.pools_path), "hosts": hosts}

    async def check_hosts(self) -> list[dict[str, Any]]:
        """Every pool's hosts, in file order: whether each answers, and which cluster holds it."""
        taken = self._taken()
        hosts = [(pool.name, host) for pool in self.pools().values() for host in pool.hosts]
        rows: list[dict[str, Any]] = [
            {"pool": pool, "host": host.host, "port": host.port, "user": host.user,
             "cluster": taken.get(host), "ok": False, "error": "", "host_key": "",
             "new_host_key": False}
            for pool, host in hosts
        ]

        async def one(row: dict[str, Any], host: SSHTarget) -> None:
            try:
                done = await self._connections.run(host, "true", timeout_s=REACH_TIMEOUT_S)
                row["ok"] = done.exit_code == 0
                # Met for the first time here: the key was pinned; show what was trusted.
                node = await self._connections.get(host)
                row["host_key"], row["new_host_key"] = node.host_key, node.first_contact
                node.first_contact = False  # told now
            except ProtocolError as exc:
                row["error"] = exc.message

        async with anyio.create_task_group() as group:
            for row, (_, host) in zip(rows, hosts, strict=True):
                group.start_soon(one, row, host)
        return rows


# mypy checks here that the class is a provider of its own handles, whole.
_PROVIDER: type[ProviderOf[SSHHandle]] = SSHProvider
