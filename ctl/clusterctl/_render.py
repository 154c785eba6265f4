"""Terminal output for clusterctl: progress lines, job logs, plain tables.

Colors only on a terminal (and never with NO_COLOR); no spinners: progress is one line per
step, so piped output stays readable.
"""

from __future__ import annotations

import os
import sys
import time

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from typing import Any

_COLORS = {"SUCCEEDED": "32", "FAILED": "31", "FAILED_SETUP": "31", "FAILED_DRIVER": "31",
           "CANCELLED": "33"}


def _color(text: str, code: str | None, stream: Any) -> str:
    if not code or os.environ.get("NO_COLOR") or not stream.isatty():
        return text
    return f"\033[{code}m{text}\033[0m"


def age(ts: float | None, until: float | None = None, suffix: str = " ago") -> str:
    if not ts:
        return "-"
    seconds = max(0.0, (until or time.time()) - ts)
    if seconds < 60:
        text = f"{int(seconds)}s"
    elif seconds < 3600:
        text = f"{seconds // 60:.0f}m"
    elif seconds < 86400:
        text = f"{seconds // 3600:.0f}h"
    else:
        text = f"{seconds // 86400:.0f}d"
    return text + suffix


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = [headers, *([str(cell) for cell in row] for row in rows)]
    # One format string for every row: `queue` prints thousands of rows on each run.
    widths = [max(map(len, column)) for column in zip(*lines, strict=False)]
    line = "  ".join(f"{{:<{width}}}" for width in widths)
    return "".join(line.format(*cells).rstrip() + "\n" for cells in lines)


# Progress lines that say something along the way rather than open a step of their own.
NOT_PHASES = ("", "warning", "ssh")


class PhaseClock:
    """Where a request's time went, by phase (`launch -v`, `start -v`): each phase from its
    first progress line until the next phase's, the last until `stop` (the job submitted,
    or the request's end). Times are the daemon's (`elapsed`), so a request followed late
    (its events replayed at once) is timed as it ran; only the last phase's end is ours."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._marks: list[tuple[str, float]] = []  # (phase, the daemon's elapsed)
        self._last_seen = 0.0  # our clock when the last progress line came
        self._end: float | None = None

    def mark(self, phase: str, elapsed: float) -> None:
        if self._end is not None or phase in NOT_PHASES:
            return
        self._last_seen = self._clock()
        if not self._marks or self._marks[-1][0] != phase:
            self._marks.append((phase, elapsed))

    def stop(self) -> None:
        if self._end is None and self._marks:
            # The last progress line's time, plus what passed here since.
            self._end = self._marks[-1][1] + self._clock() - self._last_seen

    def totals(self) -> dict[str, float]:
        """Seconds per phase, in the order each first began (a phase seen twice: summed)."""
        self.stop()
        if not self._marks or self._end is None:
            return {}
        totals: dict[str, float] = {}
        ends = [at for _, at in self._marks[1:]] + [self._end]
        for (phase, began), ended in zip(self._marks, ends, strict=True):
            totals[phase] = totals.get(phase, 0.0) + max(0.0, ended - began)
        return totals

    def summary(self) -> str | None:
        totals = self.totals()
        if not totals:
            return None
        parts = ", ".join(f"{phase} {seconds:.1f}s" for phase, seconds in totals.items())
        return f"phases: {parts} (total {sum(totals.values()):.1f}s)"


class Printer:
    """Turns a stream's events into output: logs to stdout, everything else to stderr. With
    `verbose`, each progress line names its phase, and `phases()` says where the time went."""

    def __init__(self, verbose: bool = False) -> None:
        self._out = sys.stdout.buffer
        self._last_byte = b"\n"
        self.verbose = verbose
        self.clock = PhaseClock()
        self._phases_said = False

    def note(self, text: str) -> None:
        sys.stderr.write(text + "\n")
        sys.stderr.flush()

    def event(self, event: str, data: dict[str, Any], state: dict[str, Any],
              prefix: str = "") -> None:
        if event == "log":
            chunk = data.get("data") or b""
            if chunk:
                self._out.write(chunk)
                self._out.flush()
                self._last_byte = chunk[-1:]
        elif event == "progress":
            phase = str(data.get("phase") or "")
            self.clock.mark(phase, float(data.get("elapsed") or 0.0))
            # -v: a column of phases (blank for a line that only annotates).
            shown = f"{'' if phase in NOT_PHASES else phase:<10} " if self.verbose else ""
            self.note(f"{prefix}[{data.get('elapsed', 0):6.1f}s] {shown}"
                      f"{data.get('message', '')}")
        elif event == "kept_log":  # the cluster is stopped or gone: this is its copy
            self.note(f"{prefix}({data.get('note', 'kept copy')})")
        elif event == "blocked":
            self.note(f"{prefix}waiting: {data.get('message', '')}")
        elif event == "request":
            state["request_id"] = data.get("request_id")
            state["cluster"] = data.get("cluster")
        elif event == "job":
            self.clock.stop()  # what follows is the job's own time
            state["job_id"] = data.get("job_id")
            state["cluster"] = data.get("cluster")
            self.note(f"{prefix}Job {data.get('job_id')} submitted to {data.get('cluster')}.")
            self.phases(prefix)

    def phases(self, prefix: str = "") -> None:
        """With `verbose`, where the request's time went (once its phases are over)."""
        summary = self.clock.summary() if self.verbose and not self._phases_said else None
        if summary:
            self._phases_said = True
            self.note(f"{prefix}{summary}")

    def finish_logs(self) -> None:
        # Keep the terminal prompt off the end of a log that lacks a final newline.
        if self._last_byte != b"\n" and sys.stdout.isatty():
            self._out.write(b"\n")
            self._out.flush()
            self._last_byte = b"\n"

    def job_result(self, result: dict[str, Any]) -> None:
        status = str(result.get("status") or "?")
        shown = _color(status, _COLORS.get(status), sys.stderr)
        line = f"Job {result.get('job_id')} on {result.get('cluster')}: {shown}"
        if result.get("failure_reason"):
            line += f" ({result['failure_reason']})"
        self.note(line)


def _where(place: dict[str, Any]) -> str:
    text = str(place["infra"]) + (f" ({place['instance_type']})" if place.get("instance_type")
                                  else "")
    return text + (", spot" if place.get("spot") else "")


def _price(place: dict[str, Any], nodes: int) -> str:
    each = float(place.get("price_per_hour") or 0)
    source = place.get("price_source") or "catalog"  # an older daemon's: the catalog's
    if not each:
        return f"none known ({place['provider']}: {source})"
    whole = (f", ${float(place['cluster_price_per_hour']):.3f}/h for {nodes} nodes"
             if nodes > 1 else "")
    return f"${each:.3f}/h per node{whole} ({source})"


def _budget_lines(budget: dict[str, Any] | None) -> list[tuple[str, str]]:
    """The budgets' verdict on a new cluster: refused (why), places skipped for a
    provider's budget, and what each budget counting it has left this month."""
    if not budget:
        return []
    lines = [("budget", f"REFUSED: {budget['refused']}")] if budget.get("refused") else []
    lines += [("budget", f"{s['provider']} skipped: {s['reason']}")
              for s in budget.get("skipped") or []]
    lines += [("budget", f"${float(b['left']):.2f} left ({b['level']}): {b['says']}")
              for b in budget.get("budgets") or []]
    return lines


def _size(count: int) -> str:
    value, unit = float(count), "B"
    for bigger in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"


def _value(value: Any) -> str:
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value).lower() if isinstance(value, bool) else f"{value}"


def render_plan(plan: dict[str, Any]) -> str:
    """`launch --dryrun` / `exec --dryrun`: the daemon's plan, one line per part."""
    task = plan.get("task") or {}
    nodes = int(task.get("num_nodes") or 1)
    lines = [("plan", f"{plan['says']} (dry run: nothing is made)")]
    place = plan.get("placement")
    if place:
        lines += [("placement", _where(place)), ("price", _price(place, nodes))]
    lines.append(("resources", plan.get("resources") or "-"))
    asked = plan.get("requested") or {}
    if asked:
        lines.append(("asks", ", ".join(f"{k}={_value(v)}" for k, v in asked.items())))
    alternatives = [f"{_where(p)} ${p.get('price_per_hour') or 0:.3f}/h"
                    for p in plan.get("alternatives") or []]
    if plan.get("more_alternatives"):
        alternatives.append(f"and {plan['more_alternatives']} more")
    lines += [("then", text) for text in alternatives]
    lines += [("refused", f"{r['infra']} ({r['resources']}): {r['reason'].splitlines()[0]}")
              for r in plan.get("refused") or []]
    lines += _budget_lines(plan.get("budget"))
    lines.append(("setup", "runs" if task.get("setup") else "not run"))
    lines.append(("run", "a job" if task.get("run") else "nothing"))
    if task.get("ports"):
        lines.append(("ports", ", ".join(task["ports"])))
    if task.get("envs"):
        lines.append(("envs", ", ".join(task["envs"])))
    for sync in plan.get("sync") or []:
        files = sync.get("files")
        sent = (f"{files} file{'' if files == 1 else 's'}, {_size(sync['bytes'])}"
                if files is not None
                else "a git clone" + (f" of {sync['ref']}" if sync.get("ref") else ""))
        lines.append(("sync", f"{sync['field']}: {sync['source']}: {sent}"))
    lines += [("mount", f"{b['remote']}: {b['url']} ({b['mode']})")
              for b in plan.get("buckets") or []]
    autostop = plan.get("autostop")
    if autostop:
        action = "tear down" if autostop.get("down") else "stop"
        lines.append(("autostop", f"{action} after {autostop['idle_minutes']:g} idle minutes"))
    lines += [("warning", text) for text in plan.get("warnings") or []]
    return "".join(f"{label + ':':<11}{text}\n" for label, text in lines)
