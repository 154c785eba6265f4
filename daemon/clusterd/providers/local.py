"""The `local` provider: this machine as a one-node cluster, reached without SSH.

Its "node" is a runtime directory of the cluster's own under the daemon's state directory;
stopping it leaves a marker there (the runtime layer stops Ray and the agent), and terminating
it removes the directory.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
from pathlib import Path
from typing import Any, ClassVar

import anyio
import psutil

from clusterd.node_shared import containers
from clusterd.nodes import ClusterInfo, NodeInfo, NodeStatus
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

STOPPED_MARKER = "stopped"
LOOPBACK = "127.0.0.1"


@dataclasses.dataclass(frozen=True)
class LocalHandle(ProviderHandle, provider="local"):
    dir: str  # the cluster's runtime directory on this machine (found by its cloud name too)

    def to_json(self) -> dict[str, Any]:
        return {"dir": self.dir}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> LocalHandle:
        return cls(str(data.get("dir", "")))


def _this_machine() -> tuple[float, float]:
    cpus = float(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity")
                 else os.cpu_count() or 1)
    return cpus, psutil.virtual_memory().total / 1024**3


class LocalProvider(ProviderDefaults[LocalHandle]):
    name: ClassVar[str] = "local"
    skypilot_cloud: ClassVar[str] = "Local"
    can_stop: ClassVar[bool] = True
    # Its ports are this machine's own: nothing stands in front of them.
    honoured_fields: ClassVar[frozenset[str]] = frozenset({"resources.ports"})

    def __init__(self, base_dir: Path) -> None:
        self._base_dir = base_dir

    @classmethod
    def build(cls, context: ProviderContext) -> LocalProvider:
        return cls(context.state_dir / "local")

    def _dir(self, cloud_name: str) -> Path:
        return self._base_dir / cloud_name

    async def placements(self, request: ClusterRequest) -> list[Placement]:
        cpus, memory_gb = _this_machine()
        resources = request.resources
        problems = []
        if request.num_nodes != 1:
            problems.append(f"it asks for {request.num_nodes} nodes; local has one (this "
                            "machine)")
        if resources.cpus is not None and resources.cpus > cpus:
            problems.append(f"it asks for {resources.cpus:g} CPUs; this machine has {cpus:g}")
        if resources.memory_gb is not None and resources.memory_gb > memory_gb:
            problems.append(f"it asks for {resources.memory_gb:g} GB of memory; this machine "
                            f"has {memory_gb:.1f}")
        if resources.accelerator:
            problems.append(f"it asks for {resources.accelerator}; the local provider offers "
                            "no accelerators")
        if resources.instance_type:
            problems.append("instance types mean nothing on the local provider")
        image = containers.image_of(resources.image_id)
        if image:
            runtime, why = await anyio.to_thread.run_sync(containers.find_runtime)
            if runtime is None:
                problems.append(f"resources.image_id: docker:{image} runs the job in a "
                                f"container, and this machine has no container runtime that "
                                f"answers ({why})")
        if problems:
            raise ProvisionError(
                "the local provider cannot run this task: " + "; ".join(problems),
                BlockScope.PROVIDER,
                "use --infra ssh/POOL for several nodes, or ask for less",
            )
        return [Placement("local", None, None, None, cpus, memory_gb)]

    async def create(self, request: ClusterRequest, placement: Placement) -> LocalHandle:
        path = self._dir(request.cloud_name)
        path.mkdir(parents=True, exist_ok=True)
        (path / STOPPED_MARKER).unlink(missing_ok=True)
        return LocalHandle(str(path))

    def handle_for_intent(self, cloud_name: str, intent: Placement | None) -> LocalHandle:
        return LocalHandle(str(self._dir(cloud_name)))


    async def query(self, cloud_name: str, handle: LocalHandle) -> list[NodeInfo]:
        path = self._dir(cloud_name)
        if not path.is_dir():
            return []
        status = NodeStatus.STOPPED if (path / STOPPED_MARKER).exists() else NodeStatus.RUNNING
        cpus, _ = _this_machine()
        return [
            NodeInfo(
                node_id="local",
                internal_ip=LOOPBACK,
                status=status,
                ssh=None,
                runtime_dir=str(path),
                workdir=str(path / "sky_workdir"),
                cpus=cpus,
            )
        ]

    async def query_many(
        self, clusters: list[tuple[str, LocalHandle]]
    ) -> dict[str, list[NodeInfo] | ProvisionError]:
        return {name: await self.query(name, handle) for name, handle in clusters}

    async def cluster_info(self, cloud_name: str, handle: LocalHandle) -> ClusterInfo:
        nodes = await self.query(cloud_name, handle)
        if not nodes:
            raise ProvisionError(f"local cluster {cloud_name} has no runtime directory",
                                 BlockScope.FATAL)
        return ClusterInfo(tuple(nodes))

    async def stop(self, cloud_name: str, handle: LocalHandle) -> None:
        path = self._dir(cloud_name)
        if path.is_dir():
            (path / STOPPED_MARKER).touch()

    async def start(self, cloud_name: str, handle: LocalHandle) -> LocalHandle:
        path = self._dir(cloud_name)
        path.mkdir(parents=True, exist_ok=True)
        (path / STOPPED_MARKER).unlink(missing_ok=True)
        return LocalHandle(str(path))

    async def terminate(self, cloud_name: str, handle: LocalHandle) -> None:
        path = self._dir(cloud_name)
        await anyio.to_thread.run_sync(lambda: shutil.rmtree(path, ignore_errors=True))

    async def enabled(self) -> bool:
        return True

    async def check(self) -> dict[str, Any]:
        cpus, memory_gb = _this_machine()
        return {"ok": True, "detail": f"this machine ({cpus:g} CPUs, {memory_gb:.0f} GB)"}


# mypy checks here that the class is a provider of its own handles, whole.
_PROVIDER: type[ProviderOf[LocalHandle]] = LocalProvider
