"""Job logs on the head: one directory per job, `run.log` inside, and tailing with follow.

The file is the source of truth and readers address it by byte offset, so a reader that
reconnects with the offset it last saw gets every byte exactly once. Writers wake readers
through an in-memory event instead of readers polling the file.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import BinaryIO

import anyio

from clusterd.node_shared.log_offsets import CHUNK_BYTES, tail_offset

LOG_NAME = "run.log"
# A follower re-checks the file this often even without a wake-up (belt and braces).
RECHECK_S = 1.0


class JobLog:
    def __init__(self, path: Path, wake: Callable[[], None]) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file: BinaryIO = open(path, "ab")  # noqa: SIM115 - closed in close()
        self._wake = wake
        self.closed = False

    def write(self, data: bytes) -> None:
        if not data:
            return
        self._file.write(data)
        self._file.flush()
        self._wake()

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self.closed = True
            self._wake()


class NodePrefixer:
    """Prefixes each line from one node with `(head, rank=0) `, holding partial lines back."""

    def __init__(self, label: str) -> None:
        self._prefix = label.encode() + b" "
        self._partial = b""

    def feed(self, data: bytes) -> bytes:
        data = self._partial + data
        head, sep, self._partial = data.rpartition(b"\n")
        if not sep:
            self._partial = data
            return b""
        return b"".join(self._prefix + line + b"\n" for line in head.split(b"\n"))

    def flush(self) -> bytes:
        rest, self._partial = self._partial, b""
        return self._prefix + rest + b"\n" if rest else b""


class LogHub:
    """Log files of all jobs, and wake-ups for their readers.

    `notify(job_id)` must be called on every change a reader may wait for: new bytes (done by
    JobLog) and job status changes (done by the job runner).
    """

    def __init__(self, base_dir: Path) -> None:
        self.base_dir = base_dir
        self._open: dict[int, JobLog] = {}
        self._changed: dict[int, anyio.Event] = {}

    def log_dir(self, job_id: int) -> Path:
        return self.base_dir / str(job_id)

    def open(self, job_id: int) -> JobLog:
        log = JobLog(self.log_dir(job_id) / LOG_NAME, lambda: self.notify(job_id))
        self._open[job_id] = log
        return log

    def close(self, job_id: int) -> None:
        log = self._open.pop(job_id, None)
        if log is not None:
            log.close()
        self.notify(job_id)

    def remove(self, job_id: int) -> None:
        """Delete a finished job's log directory (blocking file work: call from a thread)."""
        if job_id not in self._open:
            shutil.rmtree(self.log_dir(job_id), ignore_errors=True)

    def notify(self, job_id: int) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()

    def _change_of(self, job_id: int) -> anyio.Event:
        event = self._changed.get(job_id)
        if event is None:
            event = self._changed[job_id] = anyio.Event()
        return event

    async def tail(
        self,
        job_id: int,
        *,
        follow: bool,
        tail_lines: int,
        start_offset: int,
        job_done: Callable[[], bool],
    ) -> AsyncIterator[tuple[bytes, int]]:
        """Yield (chunk, offset after it) until the job is over and all is read (follow),
        or until the current end (no follow)."""
        path = self.log_dir(job_id) / LOG_NAME
        offset = start_offset
        if tail_lines > 0 and start_offset == 0:
            offset = tail_offset(path, tail_lines)
        while True:
            changed = self._change_of(job_id)
            finished = job_done() and job_id not in self._open
            async for chunk, end in _read_from(path, offset):
                yield chunk, end
                offset = end
            if finished or not follow:
                return
            with anyio.move_on_after(RECHECK_S):
                await changed.wait()


async def _read_from(path: Path, offset: int) -> AsyncIterator[tuple[bytes, int]]:
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return
    try:
        while True:
            chunk = os.pread(fd, CHUNK_BYTES, offset)
            if not chunk:
                return
            offset += len(chunk)
            yield chunk, offset
    finally:
        os.close(fd)
