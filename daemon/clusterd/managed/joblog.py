"""A managed job's local files: its log across attempts, and the daemon's own lines about it.

* `ID.log`: the job's output, copied from each attempt's stream by the controller (a marker
  line starts each attempt and marks each loss). It outlives the job's clusters.
* `ID.controller.log`: every daemon log line bound to `managed_job=ID` (the driver binds it
  for everything it does, the requests it starts included), as JSON lines, teed from the
  daemon's log (see `clusterd.log.tee`): the job's own share of the daemon log, whether
  that log goes to a file, a terminal or the journal, without searching the whole of it.

Both are appended only, so readers address them by byte offset. The functions here block
on file I/O: the daemon calls them from a worker thread.
"""

from __future__ import annotations

import collections
import dataclasses
import datetime
import json
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from clusterd.node_shared.log_offsets import tail_offset

CHUNK_BYTES = 64 * 1024
# A controller log line longer than this (a huge traceback) is shown cut.
MAX_LINE_CHARS = 64 * 1024
# Keys of a daemon log line that the reader gets as fields of its own (or needs no more).
_LINE_KEYS = ("timestamp", "level", "event", "managed_job")


class JobLogFiles:
    def __init__(self, directory: Path) -> None:
        self.directory = directory

    def path(self, job_id: int) -> Path:
        return self.directory / f"{job_id}.log"

    def controller_path(self, job_id: int) -> Path:
        return self.directory / f"{job_id}.controller.log"

    def create(self, job_id: int) -> None:
        self.path(job_id).touch(mode=0o600)

    def size(self, job_id: int) -> int:
        return self.path(job_id).stat().st_size

    def last_line(self, job_id: int) -> str:
        """The log's last line (its last KiB at most: enough for a marker)."""
        with open(self.path(job_id), "rb") as f:
            f.seek(max(0, f.seek(0, os.SEEK_END) - 1024))
            tail = f.read()
        return tail.rstrip(b"\n").rpartition(b"\n")[2].decode(errors="replace")

    def append(self, job_id: int, data: bytes) -> None:
        with open(self.path(job_id), "ab") as f:
            f.write(data)

    def append_controller_line(self, job_id: int, line: str) -> None:
        """One daemon log line (no newline) about the job. One write of a whole line to a
        file opened for appending: a reader never sees half of it interleaved."""
        fd = os.open(self.controller_path(job_id), os.O_WRONLY | os.O_APPEND | os.O_CREAT,
                     0o600)
        try:
            os.write(fd, line.encode("utf-8", "replace") + b"\n")
        finally:
            os.close(fd)

    def read(self, job_id: int, offset: int, limit: int = CHUNK_BYTES) -> bytes:
        """Up to `limit` bytes of the job's log from `offset` (b"" at the end)."""
        return _pread(self.path(job_id), offset, limit)

    def tail_start(self, job_id: int, lines: int) -> int:
        """Where the last `lines` lines of the job's log begin; 0 (all of it) for 0."""
        return tail_offset(self.path(job_id), lines)

    def controller_tail_start(self, job_id: int, lines: int) -> int:
        return tail_offset(self.controller_path(job_id), lines)

    def count_controller_lines(self, job_id: int, offset: int) -> int:
        """Whole lines from `offset` to the end now (read a chunk at a time)."""
        path = self.controller_path(job_id)
        count = 0
        while chunk := _pread(path, offset, CHUNK_BYTES):
            count += chunk.count(b"\n")
            offset += len(chunk)
        return count

    def controller_lines(self, job_id: int, offset: int
                         ) -> tuple[list[ControllerLine], int]:
        """The whole controller log lines from `offset` on (a chunk's worth, at least one
        line if there is one), and the offset after them. A line still being written (no
        newline yet) is left for the next read."""
        path = self.controller_path(job_id)
        data = b""
        while True:
            chunk = _pread(path, offset + len(data), CHUNK_BYTES)
            data += chunk
            cut = data.rfind(b"\n")
            if cut >= 0 or not chunk:
                break
        if cut < 0:
            return [], offset
        lines = [parse_controller_line(raw) for raw in data[:cut].split(b"\n")]
        return lines, offset + cut + 1


@dataclasses.dataclass(frozen=True)
class ControllerLine:
    """One daemon log line about a job, as a client gets it."""

    ts: float
    level: str
    message: str
    fields: dict[str, Any]

    def entry(self) -> Entry:
        return self.ts, "daemon_log", dataclasses.asdict(self)


def parse_controller_line(raw: bytes) -> ControllerLine:
    """A JSON line of the daemon log; anything else becomes its text (a time of 0 sorts it
    with the lines around it, see `merge_by_time`)."""
    text = raw.decode("utf-8", "replace")
    if len(text) > MAX_LINE_CHARS:
        text = text[:MAX_LINE_CHARS]
        return ControllerLine(0.0, "info", f"{text}... (a line of {len(raw)} bytes, cut)", {})
    try:
        entry = json.loads(text)
    except ValueError:
        entry = None
    if not isinstance(entry, dict):
        return ControllerLine(0.0, "info", text, {})
    fields = {k: v for k, v in entry.items() if k not in _LINE_KEYS}
    return ControllerLine(_timestamp(entry.get("timestamp")), str(entry.get("level", "info")),
                          str(entry.get("event", "")), fields)


def _timestamp(value: Any) -> float:
    try:
        return datetime.datetime.fromisoformat(str(value)).timestamp()
    except ValueError:
        return 0.0


# (time, frame name, frame data): one item of the controller view, in the order sent.
Entry = tuple[float, str, dict[str, Any]]


def merge_by_time(pending: collections.deque[Entry], lines: Iterable[Entry]
                  ) -> Iterator[Entry]:
    """`lines` in their order, each after the `pending` events (in time order; taken from
    the deque as they go) of its time or before. A line without a time (0) stays where it
    is. Events later than the last line stay pending, for the lines still to come."""
    for line in lines:
        while pending and line[0] and pending[0][0] <= line[0]:
            yield pending.popleft()
        yield line


def _pread(path: Path, offset: int, limit: int) -> bytes:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return os.pread(fd, limit, offset)
    finally:
        os.close(fd)
