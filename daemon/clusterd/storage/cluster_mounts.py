"""The bucket mounts each cluster's nodes have, in the state database: what the tasks
submitted to it mounted (by mount point, the latest entry winning), so that a node made
again (a repair, a start that replaces a lost node) gets them as its peers have them.

Only the task's `file_mounts` entries are kept (bucket, prefix, mode, where): no credentials,
which are sent to the nodes afresh each time."""

from __future__ import annotations

import dataclasses
import json

from clusterd.state.db import Database
from clusterd.tasks.spec import BucketMount


class ClusterMounts:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def of(self, cluster: str) -> tuple[BucketMount, ...]:
        rows = await self._db.fetchall(
            "SELECT mounts FROM cluster_bucket_mounts WHERE cluster = ?", (cluster,))
        if not rows:
            return ()
        return tuple(BucketMount(**entry) for entry in json.loads(rows[0][0]))

    async def add(self, cluster: str, mounts: tuple[BucketMount, ...]) -> None:
        kept = {m.remote: m for m in await self.of(cluster)}
        kept.update({m.remote: m for m in mounts})
        text = json.dumps([dataclasses.asdict(m) for m in kept.values()])
        await self._db.write([(
            "INSERT INTO cluster_bucket_mounts (cluster, mounts) VALUES (?, ?) "
            "ON CONFLICT (cluster) DO UPDATE SET mounts = excluded.mounts", (cluster, text))])

    async def clusters(self) -> list[str]:
        return [r[0] for r in await self._db.fetchall(
            "SELECT cluster FROM cluster_bucket_mounts ORDER BY cluster")]

    async def forget(self, cluster: str) -> None:
        await self._db.write([("DELETE FROM cluster_bucket_mounts WHERE cluster = ?",
                               (cluster,))])
