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
    from collections.abc import Sequence
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


class Printer:
    """Turns a stream's events into output: logs to stdout, everything else to stderr."""

    def __init__(self) -> None:
        self._out = sys.stdout.buffer
        self._last_byte = b"\n"

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
            self.note(f"{prefix}[{data.get('elapsed', 0):6.1f}s] {data.get('message', '')}")
        elif event == "blocked":
            self.note(f"{prefix}waiting: {data.get('message', '')}")
        elif event == "request":
            state["request_id"] = data.get("request_id")
            state["cluster"] = data.get("cluster")
        elif event == "job":
            state["job_id"] = data.get("job_id")
            state["cluster"] = data.get("cluster")
            self.note(f"{prefix}Job {data.get('job_id')} submitted to {data.get('cluster')}.")

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
