"""The buckets clusterd made, in the state database: only these are ever deleted, and
`clusterctl storage ls` lists only these.

A bucket is recorded `making` before it is created, and `made` only once S3 said this daemon's
create made it. Only `made` records are clusterd's: listed, used, released, deleted. A create
that fails (or is cancelled) drops its `making` record at once, so a name someone else takes
later is never mistaken for ours. A daemon killed mid-create leaves a `making` record; at
start-up it is confirmed by the tag the create puts on the bucket (this daemon's id and the
record's `created_at`, which no other create shares), or else forgotten: nothing is deleted
for it. Which clusters use a bucket is kept with it, so a `persistent: false` bucket is
deleted when the last cluster using it is torn down."""

from __future__ import annotations

import dataclasses
import time

from clusterd.state.db import Database

MAKING, MADE = "making", "made"


@dataclasses.dataclass(frozen=True)
class BucketRecord:
    name: str
    region: str
    state: str
    persistent: bool
    created_for: str
    created_at: float
    clusters: tuple[str, ...] = ()


class BucketRegistry:
    def __init__(self, db: Database) -> None:
        self._db = db

    async def _records(self, state: str) -> list[BucketRecord]:
        rows = await self._db.fetchall(
            "SELECT name, region, state, persistent, created_for, created_at FROM buckets "
            "WHERE state = ? ORDER BY name", (state,))
        users: dict[str, list[str]] = {}
        for bucket, cluster in await self._db.fetchall(
                "SELECT bucket, cluster FROM bucket_users ORDER BY cluster"):
            users.setdefault(bucket, []).append(cluster)
        return [BucketRecord(r[0], r[1], r[2], bool(r[3]), r[4], r[5],
                             tuple(users.get(r[0], ()))) for r in rows]

    async def all(self) -> list[BucketRecord]:
        """The buckets clusterd made (confirmed); none still being made."""
        return await self._records(MADE)

    async def unfinished(self) -> list[BucketRecord]:
        """`making` records: creates under way, or cut off by a daemon killed mid-create."""
        return await self._records(MAKING)

    async def get(self, name: str) -> BucketRecord | None:
        return next((b for b in await self.all() if b.name == name), None)

    async def making(self, name: str, region: str, persistent: bool, cluster: str) -> float:
        """Record the intent to create `name`; returns its `created_at`, the create's own
        mark (the bucket is tagged with it, see module docstring)."""
        created_at = time.time()
        await self._db.write([(
            "INSERT INTO buckets (name, region, state, persistent, created_for, created_at) "
            "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (name) DO UPDATE SET "
            "region = excluded.region, state = excluded.state, "
            "persistent = excluded.persistent, created_for = excluded.created_for, "
            "created_at = excluded.created_at",
            (name, region, MAKING, int(persistent), cluster, created_at))])
        return created_at

    async def made(self, name: str, cluster: str) -> None:
        """The bucket exists now, made by clusterd for `cluster`, which uses it."""
        await self._db.write([
            ("UPDATE buckets SET state = ? WHERE name = ?", (MADE, name)),
            ("INSERT OR IGNORE INTO bucket_users (bucket, cluster) VALUES (?, ?)",
             (name, cluster))])

    async def forget(self, name: str) -> None:
        await self._db.write([("DELETE FROM buckets WHERE name = ?", (name,))])

    async def use(self, name: str, cluster: str) -> None:
        """Record that `cluster` uses bucket `name` (kept only for buckets clusterd made)."""
        await self._db.write([(
            "INSERT OR IGNORE INTO bucket_users (bucket, cluster) SELECT name, ? FROM buckets "
            "WHERE name = ? AND state = ?", (cluster, name, MADE))])

    async def release(self, cluster: str) -> list[BucketRecord]:
        """`cluster` is gone: it uses no bucket any more. Returns the `persistent: false`
        buckets it used that no cluster uses now (to delete, then `forget`)."""
        used = {b.name for b in await self.all() if cluster in b.clusters}
        await self._db.write([("DELETE FROM bucket_users WHERE cluster = ?", (cluster,))])
        return [b for b in await self.all()
                if b.name in used and not b.persistent and not b.clusters]
