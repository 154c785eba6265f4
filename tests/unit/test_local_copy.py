"""Copies into a `local` node (runtime/runner.py LocalRunner, runtime/staging.py, rsync.py):
a source holding its destination refused, progress heard while a long copy runs, and a
failed or interrupted copy said in words with no partial copy left behind."""

from __future__ import annotations

import itertools
import os
import signal
from pathlib import Path

import anyio
import psutil
import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import rsync
from clusterd.runtime.runner import LocalRunner

pytestmark = pytest.mark.anyio


def make_tree(root: Path, files: int = 200, size: int = 1_000_000) -> Path:
    root.mkdir(parents=True)
    chunk = os.urandom(size)
    for i in range(files):
        (root / f"f{i:04}.bin").write_bytes(chunk)
    return root


def listing(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*"))
            if p.is_file()}


def leftovers(parent: Path, name: str) -> list[str]:
    return [e for e in os.listdir(parent) if e != name]


async def test_a_source_holding_its_destination_is_refused_even_if_ignored(
        tmp_path: Path) -> None:
    source = tmp_path / "home"
    (source / "state" / "local" / "c1").mkdir(parents=True)
    (source / "a.txt").write_text("a")
    # Even left out by the ignore rules, a copy into itself is never attempted.
    (source / ".skyignore").write_text("state/\n")
    destination = source / "state" / "local" / "c1" / "sky_workdir"
    with pytest.raises(ProtocolError) as caught:
        await LocalRunner().sync_dir(str(source), str(destination))
    assert caught.value.code == ErrorCode.INVALID_TASK
    assert str(source) in caught.value.message and str(destination) in caught.value.message
    assert not destination.exists()


async def test_a_file_mount_holding_its_destination_is_refused(tmp_path: Path) -> None:
    source = make_tree(tmp_path / "data", files=1, size=10)
    with pytest.raises(ProtocolError) as caught:
        await LocalRunner().put_path(str(source), str(source / "inner"))
    assert caught.value.code == ErrorCode.INVALID_TASK


async def test_a_sync_lands_whole_and_a_resync_keeps_ignored_outputs(tmp_path: Path) -> None:
    source = make_tree(tmp_path / "src", files=3, size=10)
    (source / ".gitignore").write_text("outputs/\n")
    destination = tmp_path / "node" / "sky_workdir"
    await LocalRunner().sync_dir(str(source), str(destination))
    assert listing(destination) == listing(source)
    # A job's outputs in an ignored directory survive the next sync, as with rsync in place.
    (destination / "outputs").mkdir()
    (destination / "outputs" / "result").write_text("42")
    (source / "f0000.bin").write_bytes(b"changed")
    (source / "f0001.bin").unlink()
    await LocalRunner().sync_dir(str(source), str(destination))
    assert (destination / "f0000.bin").read_bytes() == b"changed"
    assert not (destination / "f0001.bin").exists()
    assert (destination / "outputs" / "result").read_text() == "42"
    assert leftovers(destination.parent, "sky_workdir") == []


async def test_a_long_sync_reports_bytes_files_and_rate(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rsync, "PROGRESS_INTERVAL_S", 0.0)
    source = make_tree(tmp_path / "src", files=100, size=500_000)
    heard: list[rsync.Progress] = []

    async def hear(progress: rsync.Progress) -> None:
        heard.append(progress)

    await LocalRunner().sync_dir(str(source), str(tmp_path / "node" / "w"), on_progress=hear)
    assert heard, "no progress was reported"
    assert heard[-1].bytes_sent > 0 and heard[-1].files_sent > 0
    assert heard[-1].rate.endswith("/s")
    assert all(a.bytes_sent <= b.bytes_sent for a, b in itertools.pairwise(heard))


async def test_a_short_sync_reports_no_progress(tmp_path: Path) -> None:
    source = make_tree(tmp_path / "src", files=2, size=10)
    heard: list[rsync.Progress] = []

    async def hear(progress: rsync.Progress) -> None:
        heard.append(progress)

    await LocalRunner().sync_dir(str(source), str(tmp_path / "node" / "w"), on_progress=hear)
    assert heard == []


def test_progress_lines_are_read_as_rsync_writes_them() -> None:
    found = rsync.parse_progress("  1,234,567  45%   12.34MB/s    0:00:12 (xfr#12, to-chk=3/20)")
    assert found == rsync.Progress(1_234_567, 12, "12.34MB/s")
    assert rsync.parse_progress("          0   0%    0.00kB/s    0:00:00") == \
        rsync.Progress(0, 0, "0.00kB/s")
    assert rsync.parse_progress("sending incremental file list") is None


@pytest.mark.parametrize(("code", "words"), [
    (23, "some files could not be read or written"),
    (11, "disk is full"),
    (12, "disk may be full"),
    (20, "interrupted"),
    (30, "timed out"),
    (255, "SSH connection"),
])
def test_failures_are_said_in_words_with_rsync_s_last_lines(code: int, words: str) -> None:
    error = rsync.failure("copying /w to n1", code, "rsync: [sender] a problem\nlast line\n")
    assert words in error.message
    assert error.message.startswith("copying /w to n1 failed: ")
    assert "rsync exit" not in error.message
    assert error.message.endswith("rsync: [sender] a problem\nlast line")
    assert error.hint


async def interrupt_rsync_once_it_copies(tmp_path: Path, destination: Path,
                                         how: str) -> BaseException | None:
    """Start a sync of a tree that takes a while; once rsync reports progress, stop it:
    `cancel` the request, or `sigint` the rsync process (as a Ctrl-C would)."""
    source = make_tree(tmp_path / "src", files=300, size=1_000_000)
    started = anyio.Event()

    async def hear(progress: rsync.Progress) -> None:
        started.set()

    caught: BaseException | None = None
    with anyio.fail_after(120):
        async with anyio.create_task_group() as group:
            async def sync() -> None:
                nonlocal caught
                try:
                    await LocalRunner().sync_dir(str(source), str(destination),
                                                 on_progress=hear)
                except ProtocolError as exc:
                    caught = exc
            group.start_soon(sync)
            await started.wait()
            if how == "cancel":
                group.cancel_scope.cancel()
            else:
                children = [p for p in psutil.Process().children(recursive=True)
                            if p.name() == "rsync"]
                assert children
                for child in children:
                    child.send_signal(signal.SIGINT)
    return caught


@pytest.fixture
def quick_progress(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(rsync, "PROGRESS_INTERVAL_S", 0.0)


@pytest.mark.usefixtures("quick_progress")
async def test_a_cancelled_first_sync_leaves_no_partial_copy(tmp_path: Path) -> None:
    destination = tmp_path / "node" / "sky_workdir"
    await interrupt_rsync_once_it_copies(tmp_path, destination, "cancel")
    assert not destination.exists()
    assert os.listdir(destination.parent) == []
    assert not [p for p in psutil.Process().children(recursive=True) if p.name() == "rsync"]


@pytest.mark.usefixtures("quick_progress")
async def test_an_interrupted_resync_says_so_and_keeps_the_old_workdir(tmp_path: Path) -> None:
    destination = tmp_path / "node" / "sky_workdir"
    destination.mkdir(parents=True)
    (destination / "old.txt").write_text("the last sync's file")
    caught = await interrupt_rsync_once_it_copies(tmp_path, destination, "sigint")
    assert isinstance(caught, ProtocolError)
    assert "interrupted" in caught.message and "rsync exit" not in caught.message
    assert listing(destination) == {"old.txt": b"the last sync's file"}
    assert leftovers(destination.parent, "sky_workdir") == []


@pytest.mark.usefixtures("quick_progress")
async def test_a_cancelled_resync_leaves_nothing_of_itself(tmp_path: Path) -> None:
    destination = tmp_path / "node" / "sky_workdir"
    destination.mkdir(parents=True)
    (destination / "old.txt").write_text("the last sync's file")
    await interrupt_rsync_once_it_copies(tmp_path, destination, "cancel")
    assert listing(destination) == {"old.txt": b"the last sync's file"}
    assert not list(destination.rglob(".~tmp~"))
    assert leftovers(destination.parent, "sky_workdir") == []


async def test_a_resync_keeps_the_directory_jobs_run_in(tmp_path: Path) -> None:
    """A job running in the workdir during a re-sync (an exec while it runs) keeps its
    directory: what it writes there after the sync is in the workdir, not in a replaced
    directory on its way out."""
    source = make_tree(tmp_path / "src", files=3, size=10)
    (source / ".skyignore").write_text("outputs/\n")
    destination = tmp_path / "node" / "sky_workdir"
    await LocalRunner().sync_dir(str(source), str(destination))
    running_in = os.open(destination, os.O_RDONLY | os.O_DIRECTORY)  # a job's cwd
    try:
        (source / "f0002.bin").write_bytes(b"new")
        await LocalRunner().sync_dir(str(source), str(destination))
        fd = os.open("written-after", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=running_in)
        os.close(fd)
    finally:
        os.close(running_in)
    assert (destination / "written-after").exists()
    assert (destination / "f0002.bin").read_bytes() == b"new"
