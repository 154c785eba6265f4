"""What the dashboard draws of a cluster's history and its nodes' use (no daemon, no
browser): the timeline's rows, bars and marks, sparklines, and the fragments around them."""

from __future__ import annotations

import re
from typing import Any

from clusterctl.dashboard._charts import (
    classify,
    node_charts,
    phases_of,
    sparkline,
    timeline,
)
from clusterctl.dashboard._timeline import StepCache
from clusterctl.dashboard._views import environment


def event(event_id: int, before: str | None, after: str | None, reason: str,
          kind: str = "status", request_id: int | None = None) -> dict[str, Any]:
    return {"id": event_id, "ts": 1000.0 + 100 * event_id, "cluster": "c", "kind": kind,
            "from_status": before, "to_status": after, "reason": reason,
            "request_id": request_id}


HISTORY = [
    event(1, None, "INIT", "launch requested by request 1", request_id=1),
    event(2, "INIT", "UP", "launched by request 1", request_id=1),
    event(3, "UP", "UP", "autostop set: stop after 5 idle min", kind="autostop"),
    event(4, "UP", "INIT", "refresh found 1 of 2 nodes running, 1 gone"),
    event(5, "INIT", "UP", "repaired by request 6", request_id=6),
    event(6, "UP", "STOPPED", "autostopped: idle for 5m", request_id=7),
]
JOBS = [
    {"job_id": 1, "name": "train", "status": "SUCCEEDED", "submitted_at": 1250.0,
     "started_at": 1260.0, "ended_at": 1350.0},
    {"job_id": 2, "name": "eval", "status": "FAILED", "submitted_at": 1300.0,
     "started_at": 1320.0, "ended_at": 1380.0},
    {"job_id": 3, "name": "late", "status": "RUNNING", "submitted_at": 1500.0,
     "started_at": None, "ended_at": None},
]


def bars(svg: str, css: str) -> list[str]:
    return re.findall(rf'<g class="tl-bar {css}">(.*?)</g>', svg)


def test_events_are_classified_as_the_timeline_marks_them() -> None:
    assert [classify(e) for e in HISTORY] == [None, None, "autostop", "preemption",
                                              "recovery", "autostop"]
    assert classify(event(9, "UP", "STOPPED", "stopped by request 3", request_id=3)) == "stop"
    assert classify(event(9, "STOPPED", "INIT", "starting", request_id=3)) == "start"
    assert classify(event(9, "INIT", "INIT", "aws: no capacity", kind="provision")) == "finding"


def test_the_timeline_draws_statuses_phases_jobs_and_marks() -> None:
    phases = [{"start": 1100.0, "end": 1150.0, "phase": "placement", "message": "checking"},
              {"start": 1150.0, "end": 1200.0, "phase": "ray", "message": "starting Ray"}]
    svg = str(timeline(HISTORY, JOBS, phases, now=1700.0))
    assert svg.startswith('<svg class="timeline"')
    assert len(bars(svg, "tl-up")) == 2 and len(bars(svg, "tl-init")) == 2
    assert len(bars(svg, "tl-stopped")) == 1
    assert "starting Ray" in svg and "tl-phase-placement" in svg
    # Jobs 1 and 2 overlap: two rows; each has its queued time before it ran.
    assert re.findall(r'class="tl-label"[^>]*>([^<]*)<', svg) == [
        "status", "requests", "jobs", "", "events"]
    assert 'viewBox="0 0 1000 132"' in svg  # the axis and five rows
    assert len(bars(svg, "tl-ok")) == 1 and len(bars(svg, "tl-bad")) == 1
    assert 'data-job="3"' in svg and "job #3 late: queued" in svg
    assert [m for m in re.findall(r'data-kind="(\w+)"', svg)] == [
        "autostop", "preemption", "recovery", "autostop"]
    # The stopped span runs to now; bars stay inside the drawing.
    xs = [float(x) for x in re.findall(r'<rect x="([\d.]+)"', svg)]
    assert xs and min(xs) >= 80 and max(xs) <= 1000
    # An axis of clock times: a tick every 2 minutes over these 600 s.
    assert len(re.findall(r'class="tl-tick"', svg)) == 5


def test_a_torn_down_cluster_s_timeline_ends_at_its_teardown_and_text_is_escaped() -> None:
    gone = [event(1, None, "INIT", "launch <b>requested</b>", request_id=1),
            event(2, "INIT", "TERMINATED", "torn down by request 2", request_id=2)]
    svg = str(timeline(gone, [], [], now=99999.0))
    assert "<b>" not in svg and "&lt;b&gt;requested&lt;/b&gt;" in svg
    assert len(bars(svg, "tl-init")) == 1
    (width,) = re.findall(r'<g class="tl-bar tl-init"><rect x="[\d.]+" y="[\d.]+" '
                          r'width="([\d.]+)"', svg)
    assert float(width) == 920.0  # the whole axis: it ends when the cluster went
    assert "Nothing to draw" in str(timeline([], [], [], now=1.0))


def test_request_steps_become_spans_to_the_next_step_and_the_end() -> None:
    request = {"id": 1, "started_at": 1000.0, "finished_at": 1030.0}
    steps = [{"elapsed": 0.5, "phase": "placement", "message": "checking"},
             {"elapsed": 10.0, "phase": "ray", "message": "starting Ray"}]
    assert phases_of(request, steps) == [
        {"start": 1000.5, "end": 1010.0, "phase": "placement", "message": "checking"},
        {"start": 1010.0, "end": 1030.0, "phase": "ray", "message": "starting Ray"}]
    assert phases_of({"id": 2}, steps) == []


def test_sparklines_break_at_unknown_values_and_mark_the_newest() -> None:
    svg = str(sparkline([100, 200, 300, 400], [10, None, 50, 100], now=400, span_s=300,
                        label="CPU <x>"))
    assert svg.count("<polyline") == 1  # 10 stands alone; 50 -> 100 is one line
    assert 'cx="160.0" cy="1.0"' in svg  # the newest, at the top right
    assert "CPU &lt;x&gt;" in svg
    assert "<polyline" not in str(sparkline([], [], now=1))


def test_node_charts_show_cpu_memory_and_each_gpu() -> None:
    node = {"ts": [100.0, 115.0], "cpu_percent": [None, 42.4],
            "memory_used_bytes": [1e9, 2e9], "memory_total_bytes": [8e9, 8e9],
            "gpus": [{"util_percent": [5.0, 80.0], "memory_used_bytes": [1e9, 4e9],
                      "memory_total_bytes": [8e9, 8e9]}]}
    charts = node_charts(node, now=120.0)
    assert [(c["name"], c["value"]) for c in charts] == [
        ("CPU", "42%"), ("Memory", "2.0 / 8.0 GB"), ("GPU 0", "80%"),
        ("GPU 0 memory", "50%")]
    assert [c["name"] for c in node_charts({"ts": [], "gpus": []}, now=1.0)] == [
        "CPU", "Memory"]


def test_usage_and_job_fragments() -> None:
    env = environment()
    html = env.get_template("_usage.html").render(error="", nodes=[
        {"ip": "10.0.0.1", "head": True, "samples": 1,
         "charts": node_charts({"ts": [1.0], "cpu_percent": [3.0],
                                "memory_used_bytes": [1e9], "memory_total_bytes": [2e9],
                                "gpus": []}, now=2.0)}])
    assert 'data-node="10.0.0.1"' in html and "(head)" in html and "<svg" in html
    assert "1 sample<" in html
    jobs = env.get_template("_jobs.html").render(cluster={"name": "c"}, error="", jobs=[
        {"job_id": 4, "name": "t", "status": "RUNNING", "submitted_at": 1.0}])
    assert 'data-name="4 t"' in jobs and 'data-status="RUNNING"' in jobs
    assert 'href="/clusters/c/jobs/4/log.txt?download" download' in jobs


def test_the_step_cache_forgets_the_oldest() -> None:
    cache = StepCache(size=2)
    for request_id in (1, 2, 3):
        cache.put(request_id, [{"message": str(request_id)}])
    assert cache.get(1) is None and cache.get(3) == [{"message": "3"}]
