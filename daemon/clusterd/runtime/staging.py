"""A workdir on this machine copied whole or not at all: a failed or interrupted copy into a
`local` node leaves no partial copy behind.

- The first copy is built in a sibling staging directory that takes the workdir's place only
  once it is complete.
- A copy onto a workdir that exists is made in place, so jobs running in it keep their
  directory (one replaced under them would take their later outputs with it), and only what
  changed is sent. rsync holds back what it changes until the end (`--delay-updates`: each
  new or changed file is received beside the workdir, waits in its directory's `.~tmp~`,
  and is renamed into place only once every file has arrived; `--delete-delay`: nothing is
  removed before then). A copy
  that fails or is interrupted before that end leaves the workdir as it was, once its
  `.~tmp~` directories are removed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import tempfile
from collections.abc import AsyncIterator

import anyio

# rsync's default partial directory with --delay-updates, one in each directory it changes.
DELAYED = ".~tmp~"
IN_PLACE_ARGS = ("--delay-updates", "--delete-delay")

# One copy into a directory at a time (two at once would remove each other's leftovers).
_busy: dict[str, anyio.Lock] = {}


@dataclasses.dataclass(frozen=True)
class Target:
    path: str  # where rsync writes
    rsync_args: tuple[str, ...]  # what it needs for that


def _staging_prefix(name: str) -> str:
    return f".{name}.staging-"


@contextlib.asynccontextmanager
async def staged(destination: str) -> AsyncIterator[Target]:
    """Where to copy so that `destination` ends up whole or as it was (see the module's
    docstring). If the block ends normally the copy is in place; if it raises or is
    cancelled, what it left is removed."""
    destination = os.path.abspath(destination.rstrip("/") or "/")
    parent, name = os.path.split(destination)
    lock = _busy.setdefault(destination, anyio.Lock())
    async with lock:
        await anyio.to_thread.run_sync(_remove_leftovers, parent, name, destination)
        staging = tempfile.mkdtemp(prefix=_staging_prefix(name), dir=parent)
        if os.path.isdir(destination):
            # The file being received is written in `staging` (beside the workdir: the same
            # file system, so it is renamed, not copied, into place), never in the workdir.
            try:
                yield Target(destination, (*IN_PLACE_ARGS, f"--temp-dir={staging}"))
            except BaseException:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(_remove_delayed, destination)
                raise
            finally:
                with anyio.CancelScope(shield=True):
                    await anyio.to_thread.run_sync(shutil.rmtree, staging, True)
            return
        try:
            yield Target(staging, ())
            os.rename(staging, destination)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, staging, True)
            raise


def _remove_leftovers(parent: str, name: str, destination: str) -> None:
    """What a daemon killed mid-copy left (it had no chance to remove it)."""
    os.makedirs(parent, exist_ok=True)
    for entry in os.listdir(parent):
        if entry.startswith(_staging_prefix(name)):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)
    if os.path.isdir(destination):
        _remove_delayed(destination)


def _remove_delayed(root: str) -> None:
    """The `.~tmp~` directories an unfinished in-place copy left, wherever they are."""
    for directory, subdirs, _files in os.walk(root):
        if DELAYED in subdirs:
            shutil.rmtree(os.path.join(directory, DELAYED), ignore_errors=True)
            subdirs.remove(DELAYED)
