"""Keeping the garbage collector's full collections short.

The loop watch found the daemon's longest stalls under load inside the cyclic garbage
collector: a full (generation 2) collection walks every tracked object, and most of those are
the modules, classes and functions of everything imported (about 100,000 objects; 45-75 ms
per walk on the benchmark machine, every few seconds under load). None of them ever become
garbage. So the heap alive at start, once its garbage is collected, is frozen (gc.freeze): the
collector no longer walks it, and a full collection costs what was made since.

What a long-lived daemon makes later (records, a cloud SDK's service models loaded on first
use) grows the walked part again; when a full collection is seen to take longer than
SLOW_FULL_S, what is alive then is frozen too, at most once a REFREEZE_EVERY_S.

A frozen object is still freed when its last reference goes; only a cycle that becomes garbage
after it was frozen is not, so every THAW_EVERY_S the frozen part is thawed and collected
once (one long pause an hour instead of one every few seconds), then frozen again.
"""

from __future__ import annotations

import gc
import time
from typing import Any

import anyio
import anyio.abc

CHECK_S = 5.0
SLOW_FULL_S = 0.01
REFREEZE_EVERY_S = 60.0
THAW_EVERY_S = 3600.0


class Heap:
    def __init__(self, *, check_s: float = CHECK_S, slow_full_s: float = SLOW_FULL_S,
                 refreeze_every_s: float = REFREEZE_EVERY_S,
                 thaw_every_s: float = THAW_EVERY_S) -> None:
        self.check_s = check_s
        self.slow_full_s = slow_full_s
        self.refreeze_every_s = refreeze_every_s
        self.thaw_every_s = thaw_every_s
        # Generation -> [collections, seconds in all, longest], since start.
        self.pauses: dict[int, list[float]] = {g: [0, 0.0, 0.0] for g in range(3)}
        self.freezes = 0
        self.thaws = 0
        self.last_freeze_ms = 0.0
        self._started_at = 0.0
        self._full_was_slow = False
        self._frozen_at = self._thawed_at = time.monotonic()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        gc.callbacks.append(self._on_gc)
        try:
            self.freeze()
            self._thawed_at = time.monotonic()
            task_status.started()
            while True:
                await anyio.sleep(self.check_s)
                now = time.monotonic()
                if now - self._thawed_at >= self.thaw_every_s:
                    gc.unfreeze()
                    self.thaws += 1
                    self._thawed_at = now
                    self.freeze()
                elif self._full_was_slow and now - self._frozen_at >= self.refreeze_every_s:
                    self.freeze()
        finally:
            gc.callbacks.remove(self._on_gc)
            gc.unfreeze()

    def freeze(self) -> None:
        """Collect what is garbage now, then freeze the rest (garbage frozen would stay)."""
        started = time.perf_counter()
        gc.collect()
        gc.freeze()
        self.last_freeze_ms = (time.perf_counter() - started) * 1000
        self.freezes += 1
        self._frozen_at = time.monotonic()
        self._full_was_slow = False

    def _on_gc(self, phase: str, info: dict[str, int]) -> None:
        # Called in whichever thread allocated, holding the GIL for the whole collection.
        if phase == "start":
            self._started_at = time.perf_counter()
            return
        pause = time.perf_counter() - self._started_at
        generation = info["generation"]
        totals = self.pauses[generation]
        totals[0] += 1
        totals[1] += pause
        totals[2] = max(totals[2], pause)
        if generation == 2 and pause > self.slow_full_s:
            self._full_was_slow = True

    def stats(self) -> dict[str, Any]:
        return {
            "pauses": [{"generation": generation, "collections": int(count),
                        "total_ms": round(total * 1000, 1),
                        "longest_ms": round(longest * 1000, 2)}
                       for generation, (count, total, longest) in self.pauses.items()],
            "frozen_objects": gc.get_freeze_count(),
            "freezes": self.freezes, "thaws": self.thaws,
            "last_freeze_ms": round(self.last_freeze_ms, 1),
        }
