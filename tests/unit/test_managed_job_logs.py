"""A managed job's logs as `clusterctl jobs logs` gets them: the last N lines of its output
(read backwards, in bounded memory), the controller's view (events and the daemon's lines
about the job, merged by time), the tee that feeds it, and the CLI's options. A real state
database and real files; no daemon."""

from __future__ import annotations

import collections
import datetime
import io
import json
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
import structlog

from clusterctl import protocol
from clusterctl._jobs_cli import controller_line, logs_request
from clusterctl.cli import parse
from clusterctl.protocol import ErrorCode, ManagedJobStatus, ProtocolError
from clusterd import log
from clusterd.agent import logs as agent_logs
from clusterd.managed.joblog import JobLogFiles, merge_by_time, parse_controller_line
from clusterd.managed.logstream import JobLogStreams
from clusterd.managed.store import ManagedJobRecord, ManagedJobStore, SubmittedTask
from clusterd.state.db import Database

S = ManagedJobStatus
MiB = 1024 * 1024


# -- the last N lines of a job's log ----------------------------------------------------------


@pytest.fixture
def files(tmp_path: Path) -> JobLogFiles:
    return JobLogFiles(tmp_path)


def tail(files: JobLogFiles, data: bytes, lines: int) -> bytes:
    files.path(1).write_bytes(data)
    return data[files.tail_start(1, lines):]


@pytest.mark.parametrize(("data", "lines", "expected"), [
    (b"a\nb\nc\n", 2, b"b\nc\n"),
    (b"a\nb\nc", 2, b"b\nc"),  # no trailing newline: the last line still counts as one
    (b"a\nb\nc", 1, b"c"),
    (b"a\nb\nc\n", 5, b"a\nb\nc\n"),  # fewer lines than asked: all of them
    (b"a\nb\nc", 5, b"a\nb\nc"),
    (b"a\nb\nc\n", 0, b"a\nb\nc\n"),  # 0: the whole log, as `--tail 0` means
    (b"\n\n", 1, b"\n"),
    (b"", 3, b""),
])
def test_tail_lines(files: JobLogFiles, data: bytes, lines: int, expected: bytes) -> None:
    assert tail(files, data, lines) == expected


def test_tail_of_a_missing_log_is_all_of_nothing(files: JobLogFiles) -> None:
    assert files.tail_start(9, 10) == 0 and files.read(9, 0) == b""


def test_tail_lines_across_chunks(files: JobLogFiles, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(agent_logs, "CHUNK_BYTES", 7)  # lines and chunks cut each other
    data = b"".join(f"line {i}\n".encode() for i in range(50))
    assert tail(files, data, 3) == b"line 47\nline 48\nline 49\n"
    assert tail(files, data, 50) == data and tail(files, data, 51) == data
    assert tail(files, data.rstrip(b"\n"), 2) == b"line 48\nline 49"


@pytest.fixture
def huge_log(files: JobLogFiles) -> Iterator[Path]:
    """A 1 GiB log (sparse: a hole of zero bytes, no newline in it) ending in 3 lines."""
    path = files.path(1)
    end = b"first\nsecond\nthird\n"
    with open(path, "wb") as f:
        f.truncate(1024 * MiB)
        f.seek(0, 2)
        f.write(end)
    yield path
    path.unlink()


def test_tail_of_a_huge_log_reads_only_its_end(files: JobLogFiles, huge_log: Path) -> None:
    tracemalloc.start()
    try:
        start = files.tail_start(1, 2)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert files.read(1, start) == b"second\nthird\n"
    assert peak < 4 * MiB, peak


def test_more_lines_than_a_huge_log_has_scans_it_in_bounded_memory(
        files: JobLogFiles, huge_log: Path) -> None:
    # The whole file is the answer (its first "line" is the hole); memory stays at a chunk,
    # and newlines are looked for by C loops: a GiB in about a second (a Python loop per
    # byte took minutes).
    tracemalloc.start()
    started = time.monotonic()
    try:
        start = files.tail_start(1, 10)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert start == 0
    assert peak < 4 * MiB, peak
    assert time.monotonic() - started < 30


# -- streams --------------------------------------------------------------------------------


class Streams:
    """The real streams on a real store and files, and what they emitted."""

    def __init__(self, store: ManagedJobStore, files: JobLogFiles) -> None:
        self.store = store
        self.files = files
        self.changes: dict[int, anyio.Event] = {}
        self.streams = JobLogStreams(store, files, self.require, self.changed)
        self.emitted: list[tuple[str, dict[str, Any]]] = []

    def require(self, job_id: int) -> ManagedJobRecord:
        record = self.store.get(job_id)
        if record is None:
            raise ProtocolError(ErrorCode.MANAGED_JOB_NOT_FOUND, f"no managed job {job_id}")
        return record

    def changed(self, job_id: int) -> anyio.Event:
        return self.changes.setdefault(job_id, anyio.Event())

    def poke(self, job_id: int) -> None:
        event = self.changes.pop(job_id, None)
        if event is not None:
            event.set()

    async def emit(self, name: str, data: dict[str, Any]) -> None:
        self.emitted.append((name, data))

    def output(self) -> bytes:
        return b"".join(d["data"] for n, d in self.emitted if n == "log")

    def view(self) -> list[str]:
        return [d["reason"] if n == "managed_job_event" else d["message"]
                for n, d in self.emitted]


@pytest.fixture
async def streams(db: Database, files: JobLogFiles) -> Streams:
    store = ManagedJobStore(db)
    record = await store.insert("job", SubmittedTask.storable(command="echo hi"), "t")
    files.create(record.id)
    return Streams(store, files)


def stamp(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).isoformat().replace("+00:00", "Z")


def line(ts: float, message: str, **fields: Any) -> str:
    return json.dumps({"managed_job": 1, "event": message, "level": "info",
                       "timestamp": stamp(ts), **fields})


def write_raw(path: Path, text: str) -> None:
    with open(path, "a") as f:
        f.write(text)


@pytest.mark.anyio
async def test_output_tail_then_the_rest_as_it_comes(streams: Streams) -> None:
    files = streams.files
    files.append(1, b"".join(f"old {i}\n".encode() for i in range(1000)))
    done = await streams.streams.output(1, False, 2, streams.emit)
    assert streams.output() == b"old 998\nold 999\n"
    assert done["status"] == "PENDING" and done["exit_code"] == protocol.ExitCode.NOT_FINISHED
    streams.emitted.clear()
    async with anyio.create_task_group() as group:
        async def follow() -> None:
            result = await streams.streams.output(1, True, 1, streams.emit)
            assert result["status"] == "CANCELLED"

        group.start_soon(follow)
        with anyio.fail_after(10):
            while streams.output() != b"old 999\n":
                await anyio.sleep(0.01)
            files.append(1, b"new\n")
            streams.poke(1)
            while streams.output() != b"old 999\nnew\n":
                await anyio.sleep(0.01)
            await streams.store.set_status(1, S.CANCELLED, "cancelled by the user")
            streams.poke(1)
    assert streams.output() == b"old 999\nnew\n"


@pytest.mark.anyio
async def test_controller_view_merges_events_and_daemon_lines_by_time(
        streams: Streams) -> None:
    files, store = streams.files, streams.store
    now = time.time()
    files.append_controller_line(1, line(now - 60, "managed job submitted", cluster="mj-1-job"))
    await store.set_status(1, S.STARTING, "launching a cluster")
    files.append_controller_line(1, line(now + 60, "request started", op="launch"))
    files.append_controller_line(1, "not json")  # no time: stays after the line before it
    done = await streams.streams.controller(1, False, 0, streams.emit)
    assert streams.view() == ["managed job submitted", "submitted", "launching a cluster",
                              "request started", "not json"]
    name, data = streams.emitted[2]
    assert name == "managed_job_event"
    assert (data["from_status"], data["to_status"]) == ("PENDING", "STARTING")
    name, data = streams.emitted[3]
    assert name == "daemon_log" and data["fields"] == {"op": "launch"}
    assert data["level"] == "info" and abs(data["ts"] - (now + 60)) < 0.001
    assert done["status"] == "STARTING"


@pytest.mark.anyio
async def test_controller_view_tail_is_the_last_n_of_both_together(streams: Streams) -> None:
    files, store = streams.files, streams.store
    now = time.time()
    for i in range(5):
        files.append_controller_line(1, line(now - 100 + i, f"early {i}"))
    await store.set_status(1, S.STARTING, "launching a cluster")
    await store.add_event(1, "launch failed: no capacity; trying again in 10 s")
    files.append_controller_line(1, line(now + 100, "late"))
    await streams.streams.controller(1, False, 3, streams.emit)
    assert streams.view() == ["launching a cluster",
                              "launch failed: no capacity; trying again in 10 s", "late"]
    streams.emitted.clear()
    await streams.streams.controller(1, False, 5, streams.emit)
    assert streams.view() == ["early 3", "early 4", "submitted", "launching a cluster",
                              "launch failed: no capacity; trying again in 10 s", "late"][-5:]


@pytest.mark.anyio
async def test_controller_view_follows_until_the_job_is_final(streams: Streams) -> None:
    files, store = streams.files, streams.store
    async with anyio.create_task_group() as group:
        async def follow() -> None:
            result = await streams.streams.controller(1, True, 0, streams.emit)
            assert result["status"] == "SUCCEEDED" and result["exit_code"] == 0

        group.start_soon(follow)
        with anyio.fail_after(10):
            while streams.view() != ["submitted"]:
                await anyio.sleep(0.01)
            # Half a line (a writer mid-way) is held back until it is whole.
            half = line(time.time(), "half")
            write_raw(files.controller_path(1), half[:10])
            await store.set_status(1, S.STARTING, "launching a cluster")
            while streams.view() != ["submitted", "launching a cluster"]:
                await anyio.sleep(0.01)
            write_raw(files.controller_path(1), half[10:] + "\n")
            await store.set_status(1, S.RUNNING, "attempt 1 running")
            await store.set_status(1, S.SUCCEEDED, "attempt 1 succeeded")
    assert streams.view() == ["submitted", "launching a cluster", "half",
                              "attempt 1 running", "attempt 1 succeeded"]


@pytest.mark.anyio
async def test_a_follower_sees_a_status_change_and_its_line_in_the_whole_views_order(
        streams: Streams, monkeypatch: pytest.MonkeyPatch) -> None:
    """The controller commits a status change, then logs its line. Here both land while a
    follower's round is between reading the events and reading the lines (the order of a
    CI flake): the line must still come after the event, as in the view read afterwards."""
    files, store = streams.files, streams.store
    await store.set_status(1, S.STARTING, "launching a cluster")
    await store.set_status(1, S.RUNNING, "attempt 1 running")
    read_events = store.events
    landed = anyio.Event()

    async def events_then_the_job_ends(job_id: int, **kwargs: Any) -> Any:
        found = await read_events(job_id, **kwargs)
        if "after" in kwargs and not landed.is_set():
            landed.set()
            await store.set_status(1, S.SUCCEEDED, "attempt 1 succeeded")
            files.append_controller_line(1, line(time.time(), "managed job ended"))
            streams.poke(1)
        return found

    monkeypatch.setattr(store, "events", events_then_the_job_ends)
    async with anyio.create_task_group() as group:
        async def follow() -> None:
            result = await streams.streams.controller(1, True, 0, streams.emit)
            assert result["status"] == "SUCCEEDED"

        group.start_soon(follow)
        with anyio.fail_after(10):
            while len(streams.view()) < 3:
                await anyio.sleep(0.01)
            streams.poke(1)  # the next round reads the events, and then the job ends
    followed = streams.view()
    streams.emitted.clear()
    await streams.streams.controller(1, False, 0, streams.emit)
    assert followed == streams.view() == ["submitted", "launching a cluster",
                                          "attempt 1 running", "attempt 1 succeeded",
                                          "managed job ended"]


def test_merge_keeps_later_events_pending_for_later_lines() -> None:
    events = collections.deque([(5.0, "e", {"n": "e5"}), (20.0, "e", {"n": "e20"})])
    lines = [(1.0, "l", {"n": "l1"}), (5.0, "l", {"n": "l5"}), (0.0, "l", {"n": "l?"}),
             (10.0, "l", {"n": "l10"})]
    assert [d["n"] for _, _, d in merge_by_time(events, lines)] == ["l1", "e5", "l5", "l?",
                                                                     "l10"]
    assert [d["n"] for _, _, d in events] == ["e20"]


def test_a_huge_daemon_line_is_cut() -> None:
    parsed = parse_controller_line(b"x" * (200 * 1024))
    assert len(parsed.message) < 70 * 1024 and "cut" in parsed.message


# -- the tee of the daemon log ----------------------------------------------------------------


@pytest.fixture
def configured_log() -> Iterator[io.StringIO]:
    saved = structlog.get_config()
    out = io.StringIO()
    log.configure("info", stream=out)
    try:
        yield out
    finally:
        log.tee("managed_job", None)
        structlog.contextvars.clear_contextvars()
        structlog.configure(**saved)


def test_lines_bound_to_a_managed_job_are_teed_as_written(configured_log: io.StringIO) -> None:
    teed: list[tuple[Any, str]] = []
    log.tee("managed_job", lambda job, text: teed.append((job, text)))
    logger = structlog.get_logger("test")
    logger.info("not about a job")
    structlog.contextvars.bind_contextvars(managed_job=7)
    logger.info("cluster lost", why="node gone", secret_value="hunter2")
    logger.debug("below the level")
    structlog.contextvars.clear_contextvars()
    logger.warning("named in the call", managed_job=8)
    written = configured_log.getvalue().splitlines()
    assert len(written) == 3
    assert teed == [(7, written[1]), (8, written[2])]
    assert json.loads(teed[0][1])["secret_value"] == "<redacted>"


def test_a_failing_sink_costs_the_daemon_log_nothing(configured_log: io.StringIO) -> None:
    def broken(job: Any, text: str) -> None:
        raise OSError("disk full")

    log.tee("managed_job", broken)
    structlog.get_logger("test").info("still written", managed_job=1)
    assert "still written" in configured_log.getvalue()


# -- the CLI --------------------------------------------------------------------------------


def test_jobs_logs_options() -> None:
    assert logs_request(parse(["jobs", "logs", "7"])) == protocol.JobsLogsArgs(
        job_id=7, follow=True, tail=0, controller=False)
    request = logs_request(parse(["jobs", "logs", "--tail", "20", "7", "--controller",
                                  "--no-follow"]))
    assert request == protocol.JobsLogsArgs(job_id=7, follow=False, tail=20, controller=True)


def test_jobs_logs_refuses_a_negative_tail(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        logs_request(parse(["jobs", "logs", "7", "--tail", "-1"]))
    assert exit_.value.code == 1 and "--tail" in capsys.readouterr().err


def test_jobs_logs_tail_must_be_a_number(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["jobs", "logs", "7", "--tail", "many"])
    assert exit_.value.code == 2 and "invalid int value" in capsys.readouterr().err


def test_the_daemon_checks_the_new_fields() -> None:
    args = protocol.parse_args(protocol.JobsLogsArgs, {"job_id": 1, "tail": 5,
                                                       "controller": True})
    assert args.tail == 5 and args.controller is True
    with pytest.raises(ProtocolError) as error:
        protocol.parse_args(protocol.JobsLogsArgs, {"job_id": 1, "tail": "5"})
    assert error.value.code == ErrorCode.INVALID_ARGUMENT and "tail" in error.value.message


def test_controller_lines_as_printed() -> None:
    ts = time.mktime((2026, 12, 1, 12, 30, 5, 0, 0, -1)) + 0.25
    change = controller_line("managed_job_event", {
        "ts": ts, "from_status": "RUNNING", "to_status": "RECOVERING",
        "reason": "cluster mj-1-x lost: node i-1 is terminated"})
    assert change == ("2026-12-01 12:30:05.250  RUNNING -> RECOVERING: "
                      "cluster mj-1-x lost: node i-1 is terminated")
    first = controller_line("managed_job_event", {"ts": ts, "from_status": None,
                                                  "to_status": "PENDING",
                                                  "reason": "submitted"})
    assert first.endswith("  PENDING: submitted")
    printed = controller_line("daemon_log", {
        "ts": ts, "level": "warning", "message": "managed job's cluster lost",
        "fields": {"why": "node gone", "request_id": 3, "exception": "Traceback\n  boom"}})
    assert printed == ('2026-12-01 12:30:05.250  [warning] managed job\'s cluster lost  '
                       'why="node gone"  request_id=3\n    Traceback\n      boom')


@pytest.mark.parametrize(("data", "expected"), [
    (b"", ""),
    (b"=== attempt 1 ===\n", "=== attempt 1 ==="),
    (b"out\n=== attempt 2 ===\n", "=== attempt 2 ==="),
    (b"=== attempt 2 ===\nout", "out"),
    (b"x" * 5000 + b"\nlast\n\n", "last"),
])
def test_last_line(files: JobLogFiles, data: bytes, expected: str) -> None:
    files.create(1)
    files.append(1, data)
    assert files.last_line(1) == expected
