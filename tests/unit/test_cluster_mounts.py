"""What a cluster's nodes mount is kept (by mount point, the latest entry winning) until the
cluster goes, so a node made again can be given the same."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd.state.db import Database
from clusterd.storage.cluster_mounts import ClusterMounts
from clusterd.tasks.spec import BucketMount

pytestmark = pytest.mark.anyio


async def test_mounts_are_kept_per_mount_point_until_forgotten(tmp_path: Path) -> None:
    db = Database(tmp_path / "state.db")
    await db.open()
    try:
        kept = ClusterMounts(db)
        data = BucketMount("/data", "ds", "train", "COPY")
        ckpt = BucketMount("/ckpt", "ck", mode="MOUNT", local_source="/home/me/ckpt")
        await kept.add("c1", (data, ckpt))
        moved = BucketMount("/ckpt", "ck2", mode="MOUNT_CACHED")
        await kept.add("c1", (moved,))
        await kept.add("c2", (data,))
        assert set(await kept.of("c1")) == {data, moved}
        assert await kept.clusters() == ["c1", "c2"]
        await kept.forget("c1")
        assert await kept.of("c1") == ()
        assert await kept.of("c2") == (data,)
    finally:
        await db.close()
