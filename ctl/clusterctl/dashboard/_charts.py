"""Charts drawn on the server as inline SVG (no script, no library): a node's use over the last
hour as sparklines, and a cluster's timeline (its statuses, launch phases, jobs and the events
between). Every text in them comes from the daemon and is escaped here."""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from typing import Any

from markupsafe import Markup, escape

SPARK_W, SPARK_H = 160, 30
HOUR_S = 3600.0
GB = 1e9


# -- sparklines -------------------------------------------------------------------------------


def sparkline(ts: Sequence[float], values: Sequence[float | None], now: float,
              span_s: float = HOUR_S, top: float = 100.0, label: str = "") -> Markup:
    """`values` (0..`top`) at times `ts` over the `span_s` before `now`, as a line (broken
    where a value is unknown) over a filled area; the newest value as a dot."""
    runs: list[list[tuple[float, float]]] = [[]]
    for t, v in zip(ts, values, strict=True):
        if v is None or t < now - span_s:
            if runs[-1]:
                runs.append([])
            continue
        x = SPARK_W * (1 - (now - t) / span_s)
        y = SPARK_H - 1 - (SPARK_H - 2) * min(1.0, max(0.0, v / top if top else 0.0))
        runs[-1].append((round(x, 1), round(y, 1)))
    parts = [f'<svg class="spark" viewBox="0 0 {SPARK_W} {SPARK_H}" width="{SPARK_W}" '
             f'height="{SPARK_H}" role="img" aria-label="{escape(label)}">',
             f'<rect class="spark-bg" width="{SPARK_W}" height="{SPARK_H}"/>']
    for run in (r for r in runs if r):
        points = " ".join(f"{x},{y}" for x, y in run)
        if len(run) > 1:
            area = f"{run[0][0]},{SPARK_H} {points} {run[-1][0]},{SPARK_H}"
            parts.append(f'<polygon class="spark-area" points="{area}"/>')
            parts.append(f'<polyline class="spark-line" points="{points}"/>')
    last = next((r[-1] for r in reversed(runs) if r), None)
    if last is not None:
        parts.append(f'<circle class="spark-dot" cx="{last[0]}" cy="{last[1]}" r="2"/>')
    parts.append(f"<title>{escape(label)}</title></svg>")
    return Markup("".join(parts))


def _latest(values: Sequence[float | None]) -> float | None:
    return next((v for v in reversed(values) if v is not None), None)


def node_charts(node: dict[str, Any], now: float) -> list[dict[str, Any]]:
    """A node's charts (CPU, memory, then each GPU and its memory): a name, the newest value
    as text, and the sparkline."""
    ts = node.get("ts") or []
    charts = []
    cpu = node.get("cpu_percent") or []
    newest = _latest(cpu)
    charts.append(_chart("CPU", "-" if newest is None else f"{newest:.0f}%",
                         sparkline(ts, cpu, now, label="CPU use, last hour (%)")))
    used, total = node.get("memory_used_bytes") or [], node.get("memory_total_bytes") or []
    percent = [None if u is None or not t else 100 * u / t
               for u, t in zip(used, total, strict=False)]
    shown = "-" if not used else f"{used[-1] / GB:.1f} / {total[-1] / GB:.1f} GB"
    charts.append(_chart("Memory", shown,
                         sparkline(ts, percent, now, label="memory in use, last hour (%)")))
    for index, gpu in enumerate(node.get("gpus") or []):
        util = gpu.get("util_percent") or []
        newest = _latest(util)
        charts.append(_chart(f"GPU {index}", "-" if newest is None else f"{newest:.0f}%",
                             sparkline(ts, util, now, label=f"GPU {index} use, last hour (%)")))
        g_used, g_total = gpu.get("memory_used_bytes") or [], gpu.get("memory_total_bytes") or []
        g_percent = [None if u is None or not t else 100 * u / t
                     for u, t in zip(g_used, g_total, strict=False)]
        newest = _latest(g_percent)
        charts.append(_chart(f"GPU {index} memory", "-" if newest is None else f"{newest:.0f}%",
                             sparkline(ts, g_percent, now,
                                       label=f"GPU {index} memory in use, last hour (%)")))
    return charts


def _chart(name: str, value: str, svg: Markup) -> dict[str, Any]:
    return {"name": name, "value": value, "svg": svg}


# -- the timeline -----------------------------------------------------------------------------

TL_W = 1000
LABEL_W = 80
ROW_H = 22
AXIS_H = 20
MAX_JOB_ROWS = 6
STATUS_CLASSES = {"INIT": "tl-init", "UP": "tl-up", "STOPPED": "tl-stopped"}
JOB_CLASSES = {"SUCCEEDED": "tl-ok", "RUNNING": "tl-run", "FAILED": "tl-bad",
               "FAILED_SETUP": "tl-bad", "FAILED_DRIVER": "tl-bad", "CANCELLED": "tl-off"}


def classify(event: dict[str, Any]) -> str | None:
    """What a cluster event is on the timeline: a preemption (nodes lost, not by a request),
    a recovery, an autostop, a stop or start, or another finding; None for the plain status
    changes the status row already draws."""
    kind, reason = event.get("kind"), str(event.get("reason") or "")
    before, after = event.get("from_status"), event.get("to_status")
    if kind == "status":
        if reason.startswith(("autostopped", "autostop by the agent")):
            return "autostop"
        if before == "UP" and after != "UP" and not event.get("request_id"):
            return "preemption"
        if after == "UP" and reason.startswith(("repaired", "recovered")):
            return "recovery"
        if after == "STOPPED":
            return "stop"
        if before == "STOPPED" and after in ("INIT", "UP"):
            return "start"
        return None
    if kind == "autostop":
        return "autostop"
    return "finding"


MARK_WORDS = {"preemption": "nodes lost", "recovery": "recovered", "autostop": "autostop",
              "stop": "stopped", "start": "started", "finding": ""}


class _Scale:
    def __init__(self, start: float, end: float) -> None:
        self.start, self.end = start, max(end, start + 1.0)

    def x(self, t: float) -> float:
        share = (t - self.start) / (self.end - self.start)
        return round(LABEL_W + (TL_W - LABEL_W) * min(1.0, max(0.0, share)), 1)


def _bar(scale: _Scale, y: float, start: float, end: float, css: str, title: str,
         text: str = "") -> str:
    x0, x1 = scale.x(start), scale.x(end)
    width = max(2.0, x1 - x0)
    label = ""
    if text and width > 7 * len(text):
        label = (f'<text class="tl-text" x="{x0 + 4}" y="{y + ROW_H - 8}">'
                 f"{escape(text)}</text>")
    return (f'<g class="tl-bar {css}"><rect x="{x0}" y="{y + 3}" width="{round(width, 1)}" '
            f'height="{ROW_H - 6}" rx="3"/>{label}<title>{escape(title)}</title></g>')


def _status_spans(events: Sequence[dict[str, Any]], end: float
                  ) -> list[tuple[float, float, str, str]]:
    """(start, end, status, reason) from the status changes, oldest first."""
    changes = [e for e in events if e.get("kind") == "status" and e.get("to_status")]
    spans = []
    for this, after in zip(changes, [*changes[1:], None], strict=True):
        status = str(this["to_status"])
        if status == "TERMINATED":
            continue
        spans.append((float(this["ts"]), float(after["ts"]) if after else end, status,
                      str(this.get("reason") or "")))
    return spans


def _job_rows(jobs: Iterable[dict[str, Any]], now: float) -> list[list[dict[str, Any]]]:
    """Jobs packed into rows so that none overlaps another in its row (oldest first)."""
    rows: list[list[dict[str, Any]]] = []
    ends: list[float] = []
    for job in sorted(jobs, key=lambda j: j.get("submitted_at") or 0):
        start = job.get("submitted_at") or now
        for index, row_end in enumerate(ends):
            if start >= row_end:
                rows[index].append(job)
                ends[index] = job.get("ended_at") or now
                break
        else:
            if len(rows) == MAX_JOB_ROWS:
                rows[-1].append(job)  # drawn over the last row rather than not at all
                continue
            rows.append([job])
            ends.append(job.get("ended_at") or now)
    return rows


def timeline(events: Sequence[dict[str, Any]], jobs: Sequence[dict[str, Any]],
             phases: Sequence[dict[str, Any]], now: float | None = None) -> Markup:
    """The cluster's history as rows on one time axis: its status, its requests' phases
    (`{start, end, phase, message}`), its jobs (queued, then running, by status), and
    its events as marks. `events` oldest first."""
    now = time.time() if now is None else now
    starts = [float(e["ts"]) for e in events] + [float(j.get("submitted_at") or now)
                                                 for j in jobs]
    starts += [float(p["start"]) for p in phases]
    if not starts:
        return Markup('<p class="muted">Nothing to draw yet.</p>')
    gone = bool(events) and events[-1].get("to_status") == "TERMINATED"
    end = float(events[-1]["ts"]) if gone else now
    scale = _Scale(min(starts), end)
    body: list[str] = []
    y = AXIS_H
    body.append(_row_label(y, "status"))
    for start, stop, status, reason in _status_spans(events, end):
        body.append(_bar(scale, y, start, stop, STATUS_CLASSES.get(status, "tl-off"),
                         f"{status} from {_clock(start)}: {reason}", status))
    y += ROW_H
    if phases:
        body.append(_row_label(y, "requests"))
        for phase in phases:
            body.append(_bar(scale, y, float(phase["start"]), float(phase["end"]),
                             f"tl-phase tl-phase-{_css_word(phase.get('phase') or 'step')}",
                             f"{_clock(phase['start'])} {phase['message']}",
                             str(phase.get("phase") or "")))
        y += ROW_H
    for index, row in enumerate(_job_rows(jobs, now)):
        body.append(_row_label(y, "jobs" if index == 0 else ""))
        for job in row:
            body.extend(_job_bars(scale, y, job, now))
        y += ROW_H
    body.append(_row_label(y, "events"))
    body.extend(_marks(scale, y, events))
    y += ROW_H
    axis = _axis(scale, y)
    return Markup(f'<svg class="timeline" viewBox="0 0 {TL_W} {y + 2}" role="img" '
                  f'aria-label="timeline" preserveAspectRatio="xMinYMin meet">'
                  f'{axis}{"".join(body)}</svg>')


def _job_bars(scale: _Scale, y: float, job: dict[str, Any], now: float) -> list[str]:
    submitted = float(job.get("submitted_at") or now)
    started = job.get("started_at")
    ended = job.get("ended_at")
    status = str(job.get("status"))
    name = f"#{job['job_id']} {job.get('name') or ''}".strip()
    bars = []
    queued_until = float(started or ended or now)
    if queued_until - submitted > 0:
        bars.append(_bar(scale, y, submitted, queued_until, "tl-queued",
                         f"job {name}: queued from {_clock(submitted)}"))
    if started:
        bars.append(_bar(scale, y, float(started), float(ended or now),
                         JOB_CLASSES.get(status, "tl-run"),
                         f"job {name}: {status}, {_clock(started)} to "
                         f"{_clock(ended) if ended else 'now'}", name))
    return [f'<g class="tl-job" data-job="{job["job_id"]}">{"".join(bars)}</g>']


def _marks(scale: _Scale, y: float, events: Iterable[dict[str, Any]]) -> list[str]:
    marks = []
    for event in events:
        what = classify(event)
        if what is None:
            continue
        x = scale.x(float(event["ts"]))
        mid = y + ROW_H / 2
        title = f"{_clock(event['ts'])} {MARK_WORDS[what] or event.get('kind')}: " \
                f"{event.get('reason') or ''}"
        marks.append(f'<g class="tl-mark tl-{what}" data-kind="{what}"><path d="M{x} '
                     f'{mid - 7} L{x + 6} {mid} L{x} {mid + 7} L{x - 6} {mid} Z"/>'
                     f"<title>{escape(title)}</title></g>")
    return marks


def _axis(scale: _Scale, bottom: float) -> str:
    span = scale.end - scale.start
    step = next((s for s in (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600,
                             3 * 3600, 6 * 3600, 86400, 7 * 86400) if span / s <= 8), 30 * 86400)
    first = (int(scale.start) // step + 1) * step
    ticks = []
    for t in range(first, int(scale.end) + 1, step):
        x = scale.x(t)
        ticks.append(f'<line class="tl-grid" x1="{x}" y1="{AXIS_H - 4}" x2="{x}" '
                     f'y2="{bottom}"/><text class="tl-tick" x="{x}" y="{AXIS_H - 7}">'
                     f"{_clock(t, days=step >= 86400)}</text>")
    return "".join(ticks)


def _row_label(y: float, text: str) -> str:
    return f'<text class="tl-label" x="0" y="{y + ROW_H - 8}">{escape(text)}</text>'


def _clock(ts: float, days: bool = False) -> str:
    return time.strftime("%m-%d" if days else "%H:%M:%S", time.localtime(float(ts)))


def _css_word(word: str) -> str:
    return "".join(c for c in word.lower() if c.isalnum() or c == "-") or "step"


def phases_of(request: dict[str, Any], steps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """A request's steps (`progress` data: elapsed seconds, phase, message) as spans from
    each to the next, the last to the request's end (`finished_at`, or now)."""
    started = float(request.get("started_at") or 0)
    if not started or not steps:
        return []
    end = float(request.get("finished_at") or time.time())
    spans = []
    for this, after in zip(steps, [*steps[1:], None], strict=True):
        start = started + float(this.get("elapsed") or 0)
        stop = started + float(after.get("elapsed") or 0) if after else max(end, start)
        spans.append({"start": start, "end": stop, "phase": this.get("phase") or "",
                      "message": this.get("message") or ""})
    return spans
