"""Job log files on the head node (clusterd.agent.logs)."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from clusterd.agent import logs
from clusterd.agent.logs import LOG_NAME, LogHub, NodePrefixer
from clusterd.node_shared import log_offsets
from clusterd.node_shared.log_offsets import tail_offset

# --------------------------------------------------------------------------------------------
# tail_offset


def write(tmp_path: Path, data: bytes) -> Path:
    path = tmp_path / "run.log"
    path.write_bytes(data)
    return path


@pytest.mark.parametrize(
    ("data", "lines", "expected_tail"),
    [
        (b"a\nb\nc\n", 1, b"c\n"),
        (b"a\nb\nc\n", 2, b"b\nc\n"),
        (b"a\nb\nc\n", 3, b"a\nb\nc\n"),
        (b"a\nb\nc", 1, b"c"),
        (b"a\nb\nc", 2, b"b\nc"),
        (b"a\nb\nc", 3, b"a\nb\nc"),
        (b"a\nb\nc\n", 10, b"a\nb\nc\n"),
        (b"a\nb\nc", 10, b"a\nb\nc"),
        (b"one line\n", 1, b"one line\n"),
        (b"\n\n\n", 2, b"\n\n"),
        (b"a\nb\n", 0, b"a\nb\n"),
    ],
)
def test_tail_offset(tmp_path: Path, data: bytes, lines: int, expected_tail: bytes) -> None:
    path = write(tmp_path, data)
    offset = tail_offset(path, lines)
    assert data[offset:] == expected_tail


def test_tail_offset_empty_and_missing_file(tmp_path: Path) -> None:
    assert tail_offset(write(tmp_path, b""), 5) == 0
    assert tail_offset(tmp_path / "missing.log", 5) == 0


def test_tail_offset_across_chunk_boundaries(tmp_path: Path, monkeypatch: pytest.MonkeyPatch
                                             ) -> None:
    monkeypatch.setattr(log_offsets, "CHUNK_BYTES", 4)
    data = b"".join(f"line {i}\n".encode() for i in range(20))
    path = write(tmp_path, data)
    offset = tail_offset(path, 3)
    assert data[offset:] == b"line 17\nline 18\nline 19\n"


# --------------------------------------------------------------------------------------------
# NodePrefixer


def test_prefixer_prefixes_whole_lines_and_holds_back_partial() -> None:
    prefixer = NodePrefixer("(head, rank=0)")
    assert prefixer.feed(b"hel") == b""
    assert prefixer.feed(b"lo\nwor") == b"(head, rank=0) hello\n"
    assert prefixer.feed(b"ld\n\nnext\nta") == (
        b"(head, rank=0) world\n(head, rank=0) \n(head, rank=0) next\n"
    )
    assert prefixer.flush() == b"(head, rank=0) ta\n"
    assert prefixer.flush() == b""


def test_prefixer_flush_with_nothing_pending() -> None:
    prefixer = NodePrefixer("(worker1, rank=1)")
    assert prefixer.feed(b"done\n") == b"(worker1, rank=1) done\n"
    assert prefixer.flush() == b""
    assert prefixer.feed(b"") == b""


# --------------------------------------------------------------------------------------------
# LogHub.tail


async def read_all(hub: LogHub, job_id: int, **kwargs: object) -> tuple[bytes, list[int]]:
    data = b""
    offsets: list[int] = []
    async for chunk, end in hub.tail(job_id, **kwargs):  # type: ignore[arg-type]
        data += chunk
        offsets.append(end)
    return data, offsets


@pytest.mark.anyio
async def test_tail_without_follow_returns_current_content(tmp_path: Path) -> None:
    hub = LogHub(tmp_path)
    log = hub.open(1)
    log.write(b"first\nsecond\nthird\n")
    with anyio.fail_after(2):
        data, offsets = await read_all(hub, 1, follow=False, tail_lines=0, start_offset=0,
                                       job_done=lambda: False)
        assert data == b"first\nsecond\nthird\n"
        assert offsets[-1] == len(data)
        data, _ = await read_all(hub, 1, follow=False, tail_lines=2, start_offset=0,
                                 job_done=lambda: False)
        assert data == b"second\nthird\n"
    assert (tmp_path / "1" / LOG_NAME).read_bytes() == b"first\nsecond\nthird\n"
    hub.close(1)


@pytest.mark.anyio
async def test_tail_of_a_job_without_a_log_yields_nothing(tmp_path: Path) -> None:
    hub = LogHub(tmp_path)
    with anyio.fail_after(2):
        data, offsets = await read_all(hub, 42, follow=True, tail_lines=0, start_offset=0,
                                       job_done=lambda: True)
    assert (data, offsets) == (b"", [])


@pytest.mark.anyio
async def test_tail_follow_streams_new_bytes_and_ends_when_job_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Wake-ups must come from writes and close(), not from the periodic re-check.
    monkeypatch.setattr(logs, "RECHECK_S", 60.0)
    hub = LogHub(tmp_path)
    log = hub.open(7)
    log.write(b"before\n")
    done = False
    received: list[bytes] = []
    finished = anyio.Event()

    async def follower() -> None:
        async for chunk, _ in hub.tail(7, follow=True, tail_lines=0, start_offset=0,
                                       job_done=lambda: done):
            received.append(chunk)
        finished.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(follower)
            await wait_all_tasks_blocked()
            assert b"".join(received) == b"before\n"
            log.write(b"after 1\n")
            await wait_all_tasks_blocked()
            assert b"".join(received) == b"before\nafter 1\n"
            log.write(b"after 2, no newline")
            done = True
            await wait_all_tasks_blocked()
            assert not finished.is_set()  # the log is still open
            hub.close(7)
            await finished.wait()
    assert b"".join(received) == b"before\nafter 1\nafter 2, no newline"
    assert log.closed


@pytest.mark.anyio
async def test_tail_follow_wakes_on_status_change_notify(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "RECHECK_S", 60.0)
    hub = LogHub(tmp_path)
    hub.open(3).write(b"x\n")
    hub.close(3)  # the runner closes the file before the status turns terminal
    done = False
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            result: list[bytes] = []

            async def follower() -> None:
                data, _ = await read_all(hub, 3, follow=True, tail_lines=0, start_offset=0,
                                         job_done=lambda: done)
                result.append(data)

            tg.start_soon(follower)
            await wait_all_tasks_blocked()
            assert result == []
            done = True
            hub.notify(3)
    assert result == [b"x\n"]


@pytest.mark.anyio
async def test_start_offset_resumes_exactly(tmp_path: Path) -> None:
    hub = LogHub(tmp_path)
    log = hub.open(5)
    log.write(b"0123456789\nabc")
    with anyio.fail_after(2):
        first, offsets = await read_all(hub, 5, follow=False, tail_lines=0, start_offset=0,
                                        job_done=lambda: False)
        resume = offsets[-1]
        assert resume == len(first) == 14
        log.write(b"def\nghi\n")
        second, offsets = await read_all(hub, 5, follow=False, tail_lines=0,
                                         start_offset=resume, job_done=lambda: False)
        assert second == b"def\nghi\n"
        assert offsets[-1] == 22
        assert first + second == (tmp_path / "5" / LOG_NAME).read_bytes()
        # An offset in the middle gives exactly the bytes after it, tail_lines ignored.
        middle, _ = await read_all(hub, 5, follow=False, tail_lines=1, start_offset=11,
                                   job_done=lambda: False)
        assert middle == b"abcdef\nghi\n"
    hub.close(5)


@pytest.mark.anyio
async def test_tail_reads_large_logs_in_chunks_with_running_offsets(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(logs, "CHUNK_BYTES", 10)
    hub = LogHub(tmp_path)
    log = hub.open(2)
    payload = bytes(range(256)) * 4
    log.write(payload)
    hub.close(2)
    with anyio.fail_after(2):
        data, offsets = await read_all(hub, 2, follow=True, tail_lines=0, start_offset=0,
                                       job_done=lambda: True)
    assert data == payload
    assert offsets == [min(i, len(payload)) for i in range(10, len(payload) + 10, 10)]


def test_job_log_write_wakes_and_close_is_idempotent(tmp_path: Path) -> None:
    wakes: list[int] = []
    log = logs.JobLog(tmp_path / "j" / LOG_NAME, lambda: wakes.append(1))
    log.write(b"")
    assert wakes == []
    log.write(b"a")
    log.close()
    log.close()
    assert len(wakes) == 2
    assert (tmp_path / "j" / LOG_NAME).read_bytes() == b"a"
