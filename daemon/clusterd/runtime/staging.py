"""A directory on this machine replaced whole or not at all: the new contents are built in a
sibling staging directory that takes the directory's place only once it is complete, so a
failed or interrupted copy into a `local` node leaves no partial copy behind.

The staging directory starts as a hard-link clone of the current directory (`cp -al`): a
following rsync then sends only what changed (it writes a changed file as a new file and
renames it, so the old directory's files are never written through their links), and files
the copy's filters protect from deletion (a job's outputs in an ignored directory) carry over.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import AsyncIterator

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError

# One staged replacement of a directory at a time (two copies into one node's workdir at
# once would otherwise remove each other's staging directory as a leftover).
_busy: dict[str, anyio.Lock] = {}


def _leftover_prefixes(name: str) -> tuple[str, str]:
    return f".{name}.staging-", f".{name}.old-"


@contextlib.asynccontextmanager
async def staged(destination: str) -> AsyncIterator[str]:
    """Yield a staging directory holding (hard links to) what `destination` holds now.
    If the block ends normally, the staging directory becomes `destination`; if it raises or
    is cancelled, the staging directory is removed and `destination` is as it was."""
    destination = os.path.abspath(destination.rstrip("/") or "/")
    parent, name = os.path.split(destination)
    lock = _busy.setdefault(destination, anyio.Lock())
    async with lock:
        await anyio.to_thread.run_sync(_remove_leftovers, parent, name)
        staging = tempfile.mkdtemp(prefix=_leftover_prefixes(name)[0], dir=parent)
        try:
            if os.path.isdir(destination):
                await _clone(destination, staging)
            yield staging
            await anyio.to_thread.run_sync(_swap, staging, destination)
        except BaseException:
            with anyio.CancelScope(shield=True):
                await anyio.to_thread.run_sync(shutil.rmtree, staging, True)
            raise


def _remove_leftovers(parent: str, name: str) -> None:
    """What a daemon killed mid-copy left (it had no chance to remove it)."""
    os.makedirs(parent, exist_ok=True)
    prefixes = _leftover_prefixes(name)
    for entry in os.listdir(parent):
        if entry.startswith(prefixes):
            shutil.rmtree(os.path.join(parent, entry), ignore_errors=True)


async def _clone(source: str, staging: str) -> None:
    result = await anyio.run_process(["cp", "-al", "--", f"{source}/.", staging], check=False,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    if result.returncode != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"could not prepare a copy of {source}: "
            f"{result.stderr.decode(errors='replace').strip()[-300:]}",
            "check the free space and permissions of the cluster's directory")


def _swap(staging: str, destination: str) -> None:
    old = None
    if os.path.lexists(destination):
        parent, name = os.path.split(destination)
        old = tempfile.mkdtemp(prefix=_leftover_prefixes(name)[1], dir=parent)
        os.rename(destination, os.path.join(old, name))
    os.rename(staging, destination)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)
