"""A managed job's logs, streamed to a client (`clusterctl jobs logs`).

Two views, each printed so far then, with `follow`, live until the job is final:

* the job's output across its attempts (`log` events of raw bytes), from the start or from
  the last N lines (`tail`), found by reading the file backwards: a multi-GB log costs a
  chunk of memory, not its size;
* the controller's view (`--controller`): the job's status changes and other findings
  (`managed_job_event`, from the database) and the daemon's log lines about it
  (`daemon_log`, from the job's tee of the daemon log), merged by time.

A round reads the record before the files, so whatever was written before the job was seen
final is sent; a writer's poke wakes a follower, and a floor of a second covers what pokes
nobody (status changes, teed lines).
"""

from __future__ import annotations

import collections
import math
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import anyio

from clusterctl import protocol
from clusterctl.protocol import ManagedJobStatus
from clusterd.managed.joblog import Entry, JobLogFiles, merge_by_time
from clusterd.managed.store import ManagedJobEvent, ManagedJobRecord, ManagedJobStore

Emit = Callable[[str, dict[str, Any]], Awaitable[None]]
RECHECK_S = 1.0


class JobLogStreams:
    def __init__(self, store: ManagedJobStore, files: JobLogFiles,
                 require: Callable[[int], ManagedJobRecord],
                 changed: Callable[[int], anyio.Event]) -> None:
        self._store = store
        self._files = files
        self._require = require  # the record, or MANAGED_JOB_NOT_FOUND
        self._changed = changed  # set at the next poke of that job

    async def output(self, job_id: int, follow: bool, tail: int, emit: Emit
                     ) -> dict[str, Any]:
        """The job's log as `log` events `{data, offset}`; from its last `tail` lines if
        `tail` > 0."""
        record = self._require(job_id)
        offset = 0
        if tail > 0:
            offset = await anyio.to_thread.run_sync(self._files.tail_start, job_id, tail)
        while True:
            changed = self._changed(job_id)
            record = self._require(job_id)  # read before the file: nothing after it is lost
            while chunk := await anyio.to_thread.run_sync(self._files.read, job_id, offset):
                offset += len(chunk)
                await emit("log", {"data": chunk, "offset": offset})
            if record.status.is_final or not follow:
                return result(record)
            with anyio.move_on_after(RECHECK_S):
                await changed.wait()

    async def controller(self, job_id: int, follow: bool, tail: int, emit: Emit
                         ) -> dict[str, Any]:
        """The controller's view of the job; only its last `tail` entries (events and
        lines together) if `tail` > 0."""
        record = self._require(job_id)
        files = self._files
        offset = skip = after = 0
        read_at = time.time()
        if tail > 0:
            # The last N of the two merged are among the last N of each: take those, and
            # skip what is over N. Lines written meanwhile come after them, as when following.
            events = await self._store.events(job_id, last=tail)
            offset = await anyio.to_thread.run_sync(files.controller_tail_start, job_id, tail)
            lines = await anyio.to_thread.run_sync(files.count_controller_lines, job_id, offset)
            skip = max(0, len(events) + lines - tail)
        else:
            events = await self._store.events(job_id)
        first = True
        pending: collections.deque[Entry] = collections.deque()  # events not sent yet
        held: collections.deque[Entry] = collections.deque()  # lines not sent yet

        async def send(entry: Entry) -> None:
            nonlocal skip
            if skip:
                skip -= 1
            else:
                await emit(entry[1], entry[2])

        while True:
            changed = self._changed(job_id)
            record = self._require(job_id)
            final = record.status.is_final or not follow
            # A status change is committed, then its line logged: a line logged after the
            # events were read may belong after an event this round did not see. Such lines
            # wait for the next round, so a follower sees the order the whole view has.
            if not first:
                read_at = time.time()
                events = await self._store.events(job_id, after=after)
            first = False
            horizon = math.inf if final else read_at
            if events:
                after = events[-1].id
            pending.extend(_event_entry(e) for e in events)
            while True:
                for entry in merge_by_time(pending, _until(held, horizon)):
                    await send(entry)
                lines_read, offset = await anyio.to_thread.run_sync(
                    files.controller_lines, job_id, offset)
                if not lines_read:
                    break
                held.extend(line.entry() for line in lines_read)
            while pending and (not held or pending[0][0] <= held[0][0]):
                await send(pending.popleft())
            if final:
                return result(record)
            with anyio.move_on_after(RECHECK_S):
                await changed.wait()


def _until(lines: collections.deque[Entry], horizon: float) -> Iterator[Entry]:
    """The lines from the front of `lines` (taken as they go) up to the first one later than
    `horizon`; one without a time (0) goes with the line before it."""
    while lines and lines[0][0] <= horizon:
        yield lines.popleft()


def _event_entry(event: ManagedJobEvent) -> Entry:
    return event.ts, "managed_job_event", {
        "id": event.id, "ts": event.ts, "from_status": event.from_status,
        "to_status": event.to_status, "reason": event.reason}


def result(record: ManagedJobRecord) -> dict[str, Any]:
    """The final reply of a stream of the job (and of an attached `jobs_launch`)."""
    return {"job_id": record.id, "cluster": record.cluster, "status": str(record.status),
            "failure_reason": record.status_reason
            if record.status != ManagedJobStatus.SUCCEEDED else "",
            "exit_code": int(protocol.exit_code_for_managed_job(record.status))}
