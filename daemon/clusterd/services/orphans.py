"""Orphans: what this daemon made on a provider that no record names.

A record can be lost (its disk died; a state directory was copied over from another machine)
while its instances run on, costing money. The refresh loop asks every provider now and then
(`scan`); each new orphan is an event, `status` lists them with the command that removes them,
and nothing is removed unless the user asks (`clusterctl down --orphan CLOUD_NAME`).
"""

from __future__ import annotations

import time

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError, clipped
from clusterd import log
from clusterd.providers.base import Orphan
from clusterd.providers.registry import ProviderRegistry
from clusterd.requests import RunningRequest
from clusterd.state.clusters import ClusterStore

logger = log.get("clusterd.orphans")


class OrphanWatch:
    def __init__(self, store: ClusterStore, providers: ProviderRegistry) -> None:
        self._store = store
        self._providers = providers
        self.found: dict[str, Orphan] = {}
        self.scanned_at: float | None = None

    def _known(self) -> set[str]:
        return {r.cloud_name for r in self._store.all()}

    async def scan(self) -> None:
        """Ask every provider for orphans; report the new ones. A provider that cannot be
        asked now (no credentials, unreachable) keeps what it reported before."""
        found: dict[str, Orphan] = {}
        failed: set[str] = set()

        async def one(name: str) -> None:
            try:
                with anyio.fail_after(120):
                    for orphan in await self._providers.get(name).orphans(self._known):
                        found[orphan.cloud_name] = orphan
            except (ProtocolError, TimeoutError) as exc:
                failed.add(name)
                logger.info("cannot look for orphans", provider=name, error=clipped(str(exc), 200))

        async with anyio.create_task_group() as group:
            for provider in self._providers.all():
                if await provider.enabled():
                    group.start_soon(one, provider.name)
        found.update({k: v for k, v in self.found.items() if v.provider in failed})
        for cloud_name, orphan in found.items():
            if cloud_name not in self.found:
                await self._store.add_event(
                    cloud_name, "orphan",
                    f"{orphan.describe()}: made by this daemon, named by no record; "
                    f"`clusterctl down --orphan {cloud_name}` removes it")
        self.found = found
        self.scanned_at = time.time()

    def views(self) -> list[dict[str, object]]:
        return [o.to_wire() for o in self.found.values()]

    async def remove(self, request: RunningRequest, cloud_name: str) -> dict[str, object]:
        """Terminate an orphan's instances and remove what was around them."""
        orphan = self.found.get(cloud_name)
        if orphan is None:
            await self.scan()
            orphan = self.found.get(cloud_name)
        if orphan is None:
            raise ProtocolError(ErrorCode.CLUSTER_NOT_FOUND,
                                f"no orphan named {cloud_name}",
                                "`clusterctl status` lists the orphans found")
        if cloud_name in self._known():
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"{cloud_name} is a cluster's, not an orphan",
                                "tear the cluster down with `clusterctl down NAME`")
        provider = self._providers.get(orphan.provider)
        await request.progress(f"removing {orphan.describe()}", "down")
        await provider.remove_orphan(orphan)
        self.found.pop(cloud_name, None)
        await self._store.add_event(cloud_name, "orphan", f"removed {orphan.describe()} "
                                    f"(request {request.id})", request.id)
        return {"cluster": cloud_name, "status": "TERMINATED", "changed": True}
