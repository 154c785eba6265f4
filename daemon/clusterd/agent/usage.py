"""What each node's CPUs, memory and GPUs are doing: read on the node, kept by the agent.

`read_counters` runs on every node (a Ray task, see node_tasks.read_usage: no process of our
own there). It returns raw counters; the agent turns consecutive CPU counters into a percentage
(`UsageRings`), so each point is the average over the interval before it, not a snapshot. The
rings live in the agent's memory, one bounded ring per node: an hour of samples at most, and
nothing on disk.
"""

from __future__ import annotations

import contextlib
import dataclasses
import shutil
import subprocess
import time
from collections import deque
from typing import Any

import psutil

INTERVAL_S = 15.0
KEPT_S = 3600.0
# The first round's CPU window (see read_counters).
FIRST_WINDOW_S = 0.5
# A node gone for this long (torn down, lost) is forgotten with its samples.
FORGET_AFTER_S = KEPT_S
NVIDIA_SMI_TIMEOUT_S = 5.0
GPU_QUERY = "--query-gpu=utilization.gpu,memory.used,memory.total"
MIB = 1024 * 1024


@dataclasses.dataclass(frozen=True, slots=True)
class Gpu:
    util_percent: float
    memory_used_bytes: float
    memory_total_bytes: float


@dataclasses.dataclass(frozen=True, slots=True)
class Sample:
    ts: float
    cpu_percent: float | None  # None: unknown (a node's first sample without a window)
    memory_used_bytes: float
    memory_total_bytes: float
    gpus: tuple[Gpu, ...] = ()


def read_gpus(nvidia_smi: str | None = None) -> tuple[Gpu, ...]:
    """Each NVIDIA GPU's use, from nvidia-smi; none where it is missing or does not answer."""
    path = nvidia_smi or shutil.which("nvidia-smi")
    if path is None:
        return ()
    try:
        out = subprocess.run([path, GPU_QUERY, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, timeout=NVIDIA_SMI_TIMEOUT_S,
                             check=True).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return parse_gpus(out)


def parse_gpus(out: str) -> tuple[Gpu, ...]:
    """nvidia-smi's CSV lines ("37, 1024, 40960": percent, MiB used, MiB total); a line it
    cannot fill ("[N/A]") is left out."""
    gpus = []
    for line in out.splitlines():
        fields = [f.strip() for f in line.split(",")]
        if len(fields) != 3:
            continue
        with contextlib.suppress(ValueError):
            util, used, total = (float(f) for f in fields)
            gpus.append(Gpu(util, used * MIB, total * MIB))
    return tuple(gpus)


def read_counters(window_s: float = 0.0) -> dict[str, Any]:
    """This node's counters now: CPU times (busy and total seconds over all CPUs), memory and
    GPUs. With `window_s`, also the CPU use measured over that many seconds (for a node's
    first sample, which has no sample before it)."""
    measured = psutil.cpu_percent(interval=window_s) if window_s > 0 else None
    times = psutil.cpu_times()
    total = sum(times)
    idle = times.idle + getattr(times, "iowait", 0.0)
    memory = psutil.virtual_memory()
    return {
        "ts": time.time(),
        "cpu_busy_s": total - idle,
        "cpu_total_s": total,
        "cpu_percent": measured,
        "memory_used_bytes": float(memory.total - memory.available),
        "memory_total_bytes": float(memory.total),
        "gpus": [dataclasses.astuple(g) for g in read_gpus()],
    }


@dataclasses.dataclass
class _Ring:
    ip: str
    samples: deque[Sample]
    last_counters: tuple[float, float] | None = None  # (busy, total) CPU seconds
    seen_at: float = 0.0


class UsageRings:
    """The recent samples of every node, one bounded ring each (`kept_s` / `interval_s`
    samples)."""

    def __init__(self, interval_s: float = INTERVAL_S, kept_s: float = KEPT_S) -> None:
        self.interval_s = interval_s
        self._size = max(2, round(kept_s / interval_s))
        self._rings: dict[str, _Ring] = {}
        self.head_node_id = ""

    def record(self, node_id: str, ip: str, counters: dict[str, Any]) -> Sample:
        """Add a node's counters (from read_counters) as its newest sample."""
        ring = self._rings.get(node_id)
        if ring is None:
            ring = self._rings[node_id] = _Ring(ip, deque(maxlen=self._size))
        busy, total = float(counters["cpu_busy_s"]), float(counters["cpu_total_s"])
        cpu = counters.get("cpu_percent")
        if ring.last_counters is not None and total > ring.last_counters[1]:
            cpu = 100.0 * (busy - ring.last_counters[0]) / (total - ring.last_counters[1])
        ring.last_counters = (busy, total)
        ring.ip, ring.seen_at = ip, float(counters["ts"])
        sample = Sample(
            ts=float(counters["ts"]),
            cpu_percent=None if cpu is None else min(100.0, max(0.0, float(cpu))),
            memory_used_bytes=float(counters["memory_used_bytes"]),
            memory_total_bytes=float(counters["memory_total_bytes"]),
            gpus=tuple(Gpu(*g) for g in counters.get("gpus") or ()),
        )
        ring.samples.append(sample)
        return sample

    def forget_gone(self, now: float) -> None:
        for node_id in [n for n, r in self._rings.items() if now - r.seen_at > FORGET_AFTER_S]:
            del self._rings[node_id]

    def nodes(self, since: float = 0.0) -> list[tuple[str, str, bool, list[Sample]]]:
        """(node id, ip, is head, samples newer than `since`), the head first, then by ip."""
        found = [(node_id, ring.ip, node_id == self.head_node_id,
                  [s for s in ring.samples if s.ts > since])
                 for node_id, ring in self._rings.items()]
        return sorted(found, key=lambda n: (not n[2], n[1], n[0]))

    def __len__(self) -> int:
        return sum(len(r.samples) for r in self._rings.values())
