"""How late the daemon's event loop runs what is due, and what held it when it was late.

A tick in the loop sleeps PERIOD_S at a time and records how much later than asked it woke
(the lag every request waiting at that moment also paid). A watcher thread looks at the
tick's heartbeat; when it is older than HELD_S past its due time, the loop is held by one
step that does not yield, and the watcher takes that thread's stack once per stall: the
innermost frames of clusterd's own code, and the innermost frame of all (a library's). `ping`
reports both, so a benchmark names what holds the loop instead of guessing.

The watcher costs a wake-up every HELD_S / 2 and a dictionary read; it takes the GIL only
for that, and a stack only when the loop is already late.
"""

from __future__ import annotations

import collections
import os
import sys
import threading
import time
from types import FrameType
from typing import Any

import anyio
import anyio.abc

PERIOD_S = 0.05
HELD_S = 0.02
KEEP = 2400  # lag samples kept: the last two minutes at PERIOD_S
TOP = 10
OUR_CODE = os.sep + "clusterd" + os.sep


class LoopWatch:
    def __init__(self, period_s: float = PERIOD_S, held_s: float = HELD_S) -> None:
        self.period_s = period_s
        self.held_s = held_s
        self.lags: collections.deque[float] = collections.deque(maxlen=KEEP)
        self.stalls: collections.Counter[str] = collections.Counter()
        self.stall_seconds: dict[str, float] = collections.defaultdict(float)
        self._due = time.monotonic() + period_s
        self._loop_thread = threading.get_ident()
        self._stop = threading.Event()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        self._loop_thread = threading.get_ident()
        watcher = threading.Thread(target=self._watch, name="loop-watch", daemon=True)
        watcher.start()
        task_status.started()
        try:
            while True:
                self._due = time.monotonic() + self.period_s
                await anyio.sleep(self.period_s)
                self.lags.append(max(0.0, time.monotonic() - self._due))
        finally:
            self._stop.set()

    def _watch(self) -> None:
        stall_due: float | None = None  # the due time of the stall last sampled
        stall_key = ""
        while not self._stop.wait(self.held_s / 2):
            due = self._due
            late = time.monotonic() - due
            if late <= self.held_s:
                continue
            if stall_due == due:  # the same stall, sampled already: how long it lasts
                self.stall_seconds[stall_key] = max(self.stall_seconds[stall_key], late)
                continue
            frame = sys._current_frames().get(self._loop_thread)
            if frame is None:
                continue
            stall_due, stall_key = due, where(frame)
            self.stalls[stall_key] += 1
            self.stall_seconds[stall_key] = max(self.stall_seconds[stall_key], late)

    def stats(self) -> dict[str, Any]:
        lags = sorted(self.lags)

        def at(q: float) -> float:
            return round(lags[min(len(lags) - 1, int(q * len(lags)))] * 1000, 2) if lags else 0

        return {
            "lag_ms_p50": at(0.5), "lag_ms_p99": at(0.99),
            "lag_ms_max": round(lags[-1] * 1000, 2) if lags else 0,
            "samples": len(lags),
            "held": [{"where": key, "stalls": count,
                      "longest_ms": round(self.stall_seconds[key] * 1000, 1)}
                     for key, count in self.stalls.most_common(TOP)],
        }


def where(frame: FrameType, ours: int = 3) -> str:
    """`innermost frame | our innermost frames`: file:line function, innermost first."""
    innermost = _describe(frame)
    mine: list[str] = []
    current: FrameType | None = frame
    while current is not None and len(mine) < ours:
        if OUR_CODE in current.f_code.co_filename:
            mine.append(_describe(current))
        current = current.f_back
    return " | ".join([innermost, *[m for m in mine if m != innermost]])


def _describe(frame: FrameType) -> str:
    path = frame.f_code.co_filename
    if OUR_CODE in path:
        path = "clusterd" + os.sep + path.rsplit(OUR_CODE, 1)[1]
    else:
        path = os.path.basename(path)
    return f"{path}:{frame.f_lineno} {frame.f_code.co_name}"
