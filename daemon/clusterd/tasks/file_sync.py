"""What a task's copies (its workdir, its file mounts) would send, checked before anything is
copied or any node is made: a source that holds clusterd's own directories is refused (its
database, logs and keys would go to the node, and a `local` node's workdir, which lives in the
state directory, would be copied into itself), and one larger than a threshold is warned of
(refused under --strict) with its largest entries.

What a copy sends is asked of rsync itself (a dry run with the copy's own options and
filters), so .skyignore/.gitignore are read exactly as the copy reads them.
"""

from __future__ import annotations

import dataclasses
import os

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import rsync
from clusterd.commands import (
    SKYIGNORE,
    inside,
    mount_rsync_args,
    real,
    rsync_source,
    workdir_rsync_args,
)
from clusterd.tasks.spec import TaskSpec

DEFAULT_WARN_BYTES = 1_000_000_000
LARGEST_SHOWN = 5
WARN_BYTES_ENV = "CLUSTERD_SYNC_WARN_BYTES"
STRICT_SIZE_HINT = (f"refused under --strict (or strict: true in the config); leave out what "
                    f"the nodes do not need with a {SKYIGNORE}, raise {WARN_BYTES_ENV} for the "
                    f"daemon, or run without --strict to take it as a warning")


@dataclasses.dataclass(frozen=True)
class Copy:
    field: str  # the task's field, as the user wrote it
    source: str
    rsync_args: tuple[str, ...]
    filtered: bool  # whether the copy applies .skyignore/.gitignore


@dataclasses.dataclass(frozen=True)
class CopyGuard:
    """`protected`: (what it is, path) of each directory of clusterd's own that no copy may
    send; `warn_bytes`: above this a copy is warned of (refused under strict)."""

    protected: tuple[tuple[str, str], ...]
    warn_bytes: int = DEFAULT_WARN_BYTES

    async def check(self, task: TaskSpec, *, strict: bool) -> list[str]:
        """Raise INVALID_TASK for a copy that would send a protected directory's files (or,
        under `strict`, one above the threshold); return the warnings for the others."""
        warnings = []
        for copy in copies_of(task):
            for what, path in self.protected:
                if inside(copy.source, path):  # a part of clusterd's own files, sent whole
                    raise _holds(task, copy, what, path, within=True)
            held = [(what, path) for what, path in self.protected if inside(path, copy.source)]
            watched = [os.path.relpath(real(path), real(copy.source)) for _, path in held]
            transfer = await rsync.planned(copy.rsync_args, rsync_source(copy.source),
                                           watch=[w for w in watched if w != "."])
            for (what, path), relative in zip(held, watched, strict=True):
                if (relative == "." and transfer.files) or relative in transfer.watched_sent:
                    raise _holds(task, copy, what, path)
            if transfer.total_bytes > self.warn_bytes:
                warning = _too_large(copy, transfer, self.warn_bytes)
                if strict:
                    raise ProtocolError(ErrorCode.INVALID_TASK, f"{task.source}: {warning}",
                                        STRICT_SIZE_HINT)
                warnings.append(warning)
        return warnings


def copies_of(task: TaskSpec) -> list[Copy]:
    found = []
    if isinstance(task.workdir, str):
        found.append(Copy("workdir", task.workdir, tuple(workdir_rsync_args(task.workdir)),
                          True))
    for remote, local in task.file_mounts.items():
        found.append(Copy(f"file_mounts.{remote}", local, tuple(mount_rsync_args()), False))
    return found


def _holds(task: TaskSpec, copy: Copy, what: str, path: str,
           within: bool = False) -> ProtocolError:
    if within:
        return ProtocolError(
            ErrorCode.INVALID_TASK,
            f"{task.source}: {copy.field}: {copy.source} is inside {what}, {real(path)}: "
            f"copying it would send clusterd's own files to the node",
            f"use a directory outside {real(path)}")
    leave_out = (f"or leave it out in {os.path.join(copy.source, SKYIGNORE)}"
                 if copy.filtered else "(a file mount copies everything in it)")
    return ProtocolError(
        ErrorCode.INVALID_TASK,
        f"{task.source}: {copy.field}: {copy.source} holds {what}, {real(path)}: copying it "
        f"would send clusterd's own files to the node (and, on a `local` cluster, copy the "
        f"copy into itself)",
        f"use a directory that does not hold {real(path)}, {leave_out}")


def _too_large(copy: Copy, transfer: rsync.Transfer, warn_bytes: int) -> str:
    largest = sorted(transfer.by_top_entry.items(), key=lambda item: -item[1])[:LARGEST_SHOWN]
    shown = ", ".join(f"{name} ({human_bytes(size)})" for name, size in largest)
    advice = (f"add a {SKYIGNORE} to {copy.source} to leave out what the nodes do not need"
              if copy.filtered else "mount a smaller directory")
    return (f"{copy.field}: {copy.source} sends {human_bytes(transfer.total_bytes)} in "
            f"{transfer.files} files (more than {human_bytes(warn_bytes)}); largest: {shown}; "
            f"{advice}")


def human_bytes(count: int) -> str:
    value, unit = float(count), "B"
    for bigger in ("KB", "MB", "GB", "TB"):
        if value < 1000:
            break
        value, unit = value / 1000, bigger
    return f"{count} B" if unit == "B" else f"{value:.1f} {unit}"
