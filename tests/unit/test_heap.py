"""The heap keeper (clusterd/heap.py): what is alive at start is frozen out of full
collections, a slow full collection freezes again, and a thaw gives back the cycles that
became garbage while frozen."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable

import anyio
import pytest

from clusterd.heap import Heap

pytestmark = pytest.mark.anyio


class Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


async def wait_until(condition: Callable[[], bool], what: str) -> None:
    with anyio.move_on_after(5):
        while not condition():
            await anyio.sleep(0.01)
        return
    raise AssertionError(f"no {what} in 5 s")


async def test_start_freezes_what_is_alive_and_stop_thaws_it() -> None:
    heap = Heap(check_s=0.01, refreeze_every_s=3600, thaw_every_s=3600)
    alive = Node()
    async with anyio.create_task_group() as group:
        await group.start(heap.run)
        assert gc.get_freeze_count() > 0 and heap.freezes == 1
        assert not gc.is_tracked(alive) or alive not in gc.get_objects(2)
        group.cancel_scope.cancel()
    assert gc.get_freeze_count() == 0  # a stopped keeper leaves the collector as it was


async def test_a_slow_full_collection_freezes_again() -> None:
    heap = Heap(check_s=0.01, slow_full_s=0.0, refreeze_every_s=0.0, thaw_every_s=3600)
    async with anyio.create_task_group() as group:
        await group.start(heap.run)
        made_since = [Node() for _ in range(1000)]
        gc.collect()  # a full collection, "slow" by this keeper's measure
        assert heap.pauses[2][0] >= 2  # its own at start, and this one
        await wait_until(lambda: heap.freezes >= 2, "a second freeze")
        assert made_since[0] not in gc.get_objects(2)  # frozen now, not walked
        group.cancel_scope.cancel()


async def test_a_thaw_frees_cycles_that_became_garbage_while_frozen() -> None:
    heap = Heap(check_s=0.01, slow_full_s=3600, refreeze_every_s=3600, thaw_every_s=0.2)
    doomed = Node()
    gone = weakref.ref(doomed)
    async with anyio.create_task_group() as group:
        await group.start(heap.run)
        del doomed
        gc.collect()
        assert gone() is not None  # frozen: the cycle is out of the collector's sight
        await wait_until(lambda: heap.thaws >= 1, "a thaw")
        assert gone() is None
        stats = heap.stats()
        assert stats["thaws"] >= 1 and stats["frozen_objects"] == gc.get_freeze_count()
        group.cancel_scope.cancel()
