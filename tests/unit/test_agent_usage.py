"""Node use: the agent's rings (CPU from consecutive counters, bounded, head first), the
nvidia-smi parsing, what a node reads of itself, and the daemon's wire form of a node's
samples."""

from __future__ import annotations

import stat
from pathlib import Path

import pytest

from clusterd.agent import usage
from clusterd.runtime.agent_types import GpuUse, NodeUsage, UsageSample
from clusterd.services.usage import usage_wire


def counters(ts: float, busy: float, total: float, used: float = 1e9, **extra: object
             ) -> dict[str, object]:
    return {"ts": ts, "cpu_busy_s": busy, "cpu_total_s": total, "cpu_percent": None,
            "memory_used_bytes": used, "memory_total_bytes": 4e9, **extra}


def test_cpu_is_the_share_of_busy_time_between_samples() -> None:
    rings = usage.UsageRings(interval_s=15, kept_s=3600)
    first = rings.record("n1", "10.0.0.1", counters(100, busy=50, total=200))
    assert first.cpu_percent is None  # nothing before it, and no window measured
    second = rings.record("n1", "10.0.0.1", counters(115, busy=80, total=260))
    assert second.cpu_percent == pytest.approx(50.0)  # 30 busy of 60 s
    # A first sample measured over a window keeps that measure.
    measured = rings.record("n2", "10.0.0.2", counters(100, 1, 2, cpu_percent=12.5))
    assert measured.cpu_percent == 12.5


def test_rings_are_bounded_forget_gone_nodes_and_list_the_head_first() -> None:
    rings = usage.UsageRings(interval_s=15, kept_s=60)  # 4 samples a node
    rings.head_node_id = "head"
    for i in range(10):
        rings.record("worker", "10.0.0.9", counters(1000 + 15 * i, i, 10 * i))
        rings.record("head", "10.0.0.5", counters(1000 + 15 * i, i, 10 * i,
                                                  gpus=[(30.0, 1e9, 8e9)]))
    nodes = rings.nodes()
    assert [(n[0], n[2]) for n in nodes] == [("head", True), ("worker", False)]
    assert [len(n[3]) for n in nodes] == [4, 4]
    assert len(rings) == 8
    assert [s.ts for s in nodes[0][3]] == [1090, 1105, 1120, 1135]
    assert nodes[0][3][-1].gpus == (usage.Gpu(30.0, 1e9, 8e9),)
    assert [s.ts for s in rings.nodes(since=1120)[0][3]] == [1135]
    rings.forget_gone(now=1135 + usage.FORGET_AFTER_S + 1)
    assert rings.nodes() == []


def test_nvidia_smi_lines_are_parsed_and_unfilled_ones_left_out() -> None:
    gpus = usage.parse_gpus("37, 1024, 40960\n[N/A], 5, 10\n\nnonsense\n")
    assert gpus == (usage.Gpu(37.0, 1024 * usage.MIB, 40960 * usage.MIB),)


def test_gpus_come_from_nvidia_smi_and_none_without_it(tmp_path: Path) -> None:
    assert usage.read_gpus(str(tmp_path / "absent")) == ()
    fake = tmp_path / "nvidia-smi"
    fake.write_text("#!/bin/sh\necho '5, 100, 200'\necho '95, 150, 200'\n")
    fake.chmod(fake.stat().st_mode | stat.S_IXUSR)
    assert [g.util_percent for g in usage.read_gpus(str(fake))] == [5.0, 95.0]
    failing = tmp_path / "failing"
    failing.write_text("#!/bin/sh\nexit 9\n")
    failing.chmod(0o700)
    assert usage.read_gpus(str(failing)) == ()


def test_a_node_reads_its_own_counters() -> None:
    found = usage.read_counters()
    assert found["cpu_total_s"] >= found["cpu_busy_s"] > 0
    assert 0 < found["memory_used_bytes"] < found["memory_total_bytes"]
    assert found["cpu_percent"] is None
    assert isinstance(found["gpus"], list)
    windowed = usage.read_counters(window_s=0.05)
    assert 0.0 <= windowed["cpu_percent"] <= 100.0


def test_the_wire_form_is_one_list_per_series() -> None:
    node = NodeUsage("n1", "10.0.0.1", True, (
        UsageSample(1.0, None, 1e9, 4e9, ()),
        UsageSample(16.0, 25.0, 2e9, 4e9, (GpuUse(50.0, 1e9, 8e9),)),
    ))
    wire = usage_wire(node)
    assert wire["ts"] == [1.0, 16.0]
    assert wire["cpu_percent"] == [None, 25.0]
    assert wire["memory_used_bytes"] == [1e9, 2e9]
    assert wire["gpus"] == [{"util_percent": [None, 50.0],
                             "memory_used_bytes": [None, 1e9],
                             "memory_total_bytes": [None, 8e9]}]
    assert usage_wire(NodeUsage("n2", "", False, ()))["gpus"] == []
