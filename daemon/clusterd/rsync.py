"""Running rsync for the daemon's copies: its progress while it runs, what a copy would send
(asked of rsync itself, with the copy's own filters, so no ignore rule is read twice and read
differently), and its failures said in words.

Both runners (runtime/runner.py, ssh/runner.py) and the pre-copy checks (tasks/file_sync.py)
build on this module, which imports neither.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import re
import signal
import subprocess
import tempfile
from collections.abc import Awaitable, Callable, Sequence

import anyio
import anyio.abc

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.commands import CommandResult, rsync_binary
from clusterd.concurrency import first_error

# The most one progress line per copy per this many seconds; none for a copy done sooner.
PROGRESS_INTERVAL_S = 1.0
# rsync --info=progress2: "  1,234,567  45%   12.34MB/s    0:00:12 (xfr#12, to-chk=3/20)".
_PROGRESS = re.compile(r"^\s*([\d,]+)\s+\d+%\s+(\S+/s)\s+\S+(?:\s+\(xfr#(\d+),)?")
_OUTPUT_LIMIT = 64 * 1024  # of what rsync says that a result keeps

# rsync's exit codes (its man page, EXIT VALUES), as a user would want them said.
_MEANINGS: dict[int, tuple[str, str]] = {
    1: ("rsync refused its arguments", "report this: clusterd built the rsync command"),
    2: ("the two ends' rsync versions share no protocol",
        "install a newer rsync on the node"),
    3: ("a file or directory could not be selected or made at the destination",
        "check the destination path and its permissions on the node"),
    5: ("rsync could not start its session with the node", "check that rsync runs there"),
    10: ("a socket error stopped the copy", "check the connection to the node"),
    11: ("a file could not be written: the node's disk is full or failed (I/O error)",
         "free space on the node (or add large files to .skyignore) and try again"),
    12: ("the copy's data stream broke: the node's disk may be full, or its rsync died",
         "free space on the node and check the connection, then try again"),
    20: ("the copy was interrupted before it finished", "run it again"),
    23: ("some files could not be read or written, so the copy is incomplete",
         "fix the files named below (permissions, names), or add them to .skyignore"),
    24: ("some files vanished while they were copied",
         "run it again once nothing else changes the directory"),
    30: ("the copy timed out sending or receiving data", "check the connection to the node"),
    35: ("the copy timed out waiting for the node's rsync",
         "check the connection to the node"),
    255: ("the SSH connection to the node failed during the copy",
          "check that the node is up and reachable (`clusterctl status -r`)"),
}


@dataclasses.dataclass(frozen=True)
class Progress:
    """How far a copy is: bytes and files sent so far, and rsync's current rate."""

    bytes_sent: int
    files_sent: int
    rate: str  # as rsync says it, e.g. "12.34MB/s"


ProgressHook = Callable[[Progress], Awaitable[None]]


@dataclasses.dataclass(frozen=True)
class Transfer:
    """What a copy would send: file count and bytes, bytes by top-level entry, and which of
    the watched paths (relative to the source) would have any file of theirs sent."""

    files: int
    total_bytes: int
    by_top_entry: dict[str, int]
    watched_sent: frozenset[str]


def failure(action: str, exit_code: int, said: str) -> ProtocolError:
    """The error for a failed rsync `action` ("copying X to Y"): what went wrong in words,
    then rsync's last words."""
    meaning, hint = _MEANINGS.get(
        exit_code, (f"rsync failed (exit {exit_code})", "see the daemon's log for more"))
    tail = "\n".join(said.strip().splitlines()[-5:])
    return ProtocolError(ErrorCode.PROVIDER_ERROR,
                         f"{action} failed: {meaning}" + (f"\n{tail}" if tail else ""), hint)


def timed_out(action: str, timeout_s: float) -> ProtocolError:
    return ProtocolError(ErrorCode.PROVIDER_ERROR,
                         f"{action} failed: it took longer than {timeout_s:g} s",
                         "make the directory smaller (.skyignore), or check the connection "
                         "to the node")


async def run_or_fail(argv: Sequence[str], action: str, *, timeout_s: float,
                      on_progress: ProgressHook | None = None,
                      on_line: Callable[[str], None] | None = None,
                      env: dict[str, str] | None = None) -> CommandResult:
    """`run`, raising `failure` for a non-zero exit and for running past `timeout_s`."""
    try:
        result = await run(argv, timeout_s=timeout_s, on_progress=on_progress,
                           on_line=on_line, env=env)
    except TimeoutError:
        raise timed_out(action, timeout_s) from None
    if result.exit_code != 0:
        raise failure(action, result.exit_code, result.error_tail(5))
    return result


async def run(argv: Sequence[str], *, timeout_s: float, on_progress: ProgressHook | None = None,
              on_line: Callable[[str], None] | None = None,
              env: dict[str, str] | None = None) -> CommandResult:
    """Run an rsync command line to its end. With `on_progress`, rsync reports progress
    (--info=progress2 is added) and the hook hears it at most once per PROGRESS_INTERVAL_S.
    Each other line of its output goes to `on_line` if given (else the result keeps the
    last of them). Cancelled or timed out, rsync is killed and waited for before this
    returns."""
    args = [*argv[:1], "--info=progress2", *argv[1:]] if on_progress else list(argv)
    stderr = bytearray()
    stdout = bytearray()

    def keep(line: str) -> None:
        stdout.extend(line.encode() + b"\n")
        del stdout[:-_OUTPUT_LIMIT]

    with anyio.fail_after(timeout_s):
        # A group of its own: rsync forks its receiver (and, over SSH, its shell), and what
        # a stopped copy leaves is cleaned up only once none of them writes any more.
        process = await anyio.open_process(args, stdout=subprocess.PIPE,
                                           stderr=subprocess.PIPE, env=env,
                                           start_new_session=True)
        try:
            with first_error():
                async with anyio.create_task_group() as group:
                    assert process.stderr is not None and process.stdout is not None
                    group.start_soon(_collect, process.stderr, stderr)
                    await _follow(process.stdout, on_line or keep, on_progress)
                    code = await process.wait()
        except BaseException:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await process.wait()
            raise
        finally:
            with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                await process.aclose()
                await _end_group(process.pid)
    return CommandResult(code, bytes(stdout), bytes(stderr))


async def _end_group(pgid: int) -> None:
    """Kill what is left of rsync's process group and wait until it is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
        while True:
            await anyio.sleep(0.02)
            os.killpg(pgid, 0)  # ProcessLookupError once no member is left


def parse_progress(line: str) -> Progress | None:
    found = _PROGRESS.match(line)
    if found is None:
        return None
    return Progress(int(found[1].replace(",", "")), int(found[3] or 0), found[2])


async def _collect(stream: anyio.abc.ByteReceiveStream, into: bytearray) -> None:
    async for chunk in stream:
        into.extend(chunk)
        del into[:-_OUTPUT_LIMIT]


async def _follow(stream: anyio.abc.ByteReceiveStream, on_line: Callable[[str], None],
                  on_progress: ProgressHook | None) -> None:
    """Read rsync's stdout by lines (progress lines end in \\r): progress to its hook,
    throttled; the rest to `on_line`."""
    pending = b""
    last = anyio.current_time()
    async for chunk in stream:
        *lines, pending = re.split(rb"[\r\n]", pending + chunk)
        latest = None
        for line in lines:
            text = line.decode(errors="replace")
            parsed = parse_progress(text) if on_progress else None
            if parsed is not None:
                latest = parsed
            elif text:
                on_line(text)
        now = anyio.current_time()
        if on_progress and latest is not None and now - last >= PROGRESS_INTERVAL_S:
            last = now
            await on_progress(latest)
    if pending:
        on_line(pending.decode(errors="replace"))


async def planned(args: Sequence[str], source: str, *, watch: Sequence[str] = (),
                  timeout_s: float = 300) -> Transfer:
    """What `rsync ARGS SOURCE DEST` would send to an empty DEST, by rsync's own dry run
    with the same arguments (its filters, its merge files per directory). `watch`: paths
    relative to SOURCE; the answer says which of them would have a file of theirs sent."""
    files = total = 0
    by_top: dict[str, int] = {}
    sent: set[str] = set()
    prefixes = [(w, w.rstrip("/") + "/") for w in watch]

    def count(line: str) -> None:
        nonlocal files, total
        size_text, _, name = line.partition(" ")
        if not size_text.isdigit() or not name or name.endswith("/"):
            return  # directories: their own size says nothing of what is sent
        size = int(size_text)
        files += 1
        total += size
        top = name.split("/", 1)[0]
        by_top[top] = by_top.get(top, 0) + size
        sent.update(w for w, prefix in prefixes if name == w or name.startswith(prefix))

    with tempfile.TemporaryDirectory(prefix="clusterd-plan-") as empty:
        await run_or_fail(
            [rsync_binary(), *args, "--dry-run", "--out-format=%l %n", source, empty + "/"],
            f"counting what a copy of {source} sends", timeout_s=timeout_s, on_line=count)
    return Transfer(files, total, by_top, frozenset(sent))
