"""Ops of buckets clusterd made (`clusterctl storage ...`)."""

from __future__ import annotations

from typing import Any

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.storage.service import StorageService
from clusterd.tasks.buckets import bucket_name_problem

from .connection import Call


class StorageHandlers:
    def __init__(self, storage: StorageService) -> None:
        self._storage = storage

    def table(self) -> dict[str, Any]:
        return {protocol.StorageLsArgs.op: self.ls,
                protocol.StorageDeleteArgs.op: self.delete}

    async def ls(self, call: Call, args: protocol.StorageLsArgs) -> dict[str, Any]:
        rows = await self._storage.listing()
        return {"buckets": [{
            "name": record.name, "region": record.region, "persistent": record.persistent,
            "created_for": record.created_for, "created_at": record.created_at,
            "clusters": list(record.clusters), "objects": objects, "bytes": size,
        } for record, objects, size in rows]}

    async def delete(self, call: Call, args: protocol.StorageDeleteArgs) -> dict[str, Any]:
        problem = bucket_name_problem(args.name)
        if problem is not None:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"{args.name!r}: {problem}")
        record = await self._storage.delete(args.name)
        return {"name": record.name, "deleted": True}
