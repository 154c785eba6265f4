"""Running commands and copying files on a node: the one seam between the runtime code and how
a node is reached (a local process for the `local` provider, an SSH channel otherwise)."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import rsync
from clusterd.commands import (
    CommandResult,
    inside,
    mount_rsync_args,
    real,
    rsync_binary,
    rsync_source,
    workdir_rsync_args,
)
from clusterd.runtime.staging import staged


class CommandRunner(Protocol):
    """How the daemon acts on one node. Implementations must not block the event loop."""

    node_name: str
    python: str  # the runtime's python on that node

    async def run(
        self, argv: Sequence[str], *, input: bytes | Path | None = None,
        timeout_s: float = 120
    ) -> CommandResult:
        """Run argv on the node; never raises for a non-zero exit (check the result).
        `input` is its stdin: bytes, or a local file streamed to it as it is read."""
        ...

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        """Make `destination` on the node hold the files of local directory `source`,
        honouring .skyignore/.gitignore. Raises ProtocolError on failure, saying why in
        words. `on_progress` hears how far a long copy is (rsync.run throttles it)."""
        ...

    async def put_path(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        """Copy a local file or directory to `destination` on the node."""
        ...


class LocalRunner:
    """This machine: commands are local processes, copies are local rsyncs."""

    def __init__(self, node_name: str = "local", python: str | None = None,
                 env: dict[str, str] | None = None) -> None:
        self.node_name = node_name
        self.python = python or sys.executable
        self._env = env

    async def run(
        self, argv: Sequence[str], *, input: bytes | Path | None = None,
        timeout_s: float = 120
    ) -> CommandResult:
        with contextlib.ExitStack() as stack, anyio.fail_after(timeout_s):
            streamed = None
            if isinstance(input, Path):
                streamed = await anyio.to_thread.run_sync(input.open, "rb")
                stack.callback(streamed.close)
            result = await anyio.run_process(
                list(argv), input=None if isinstance(input, Path) else input, stdin=streamed,
                check=False, env=self._env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
            )
        return CommandResult(result.returncode, result.stdout, result.stderr)

    def _refuse_copy_into_itself(self, source: str, destination: str) -> None:
        """A source holding its own destination would copy the copy into itself, again and
        again, until the disk is full: refused, whatever the ignore rules say."""
        if inside(destination, source):
            raise ProtocolError(
                ErrorCode.INVALID_TASK,
                f"{source} holds its own destination on {self.node_name}, "
                f"{real(destination)}: copying it would copy the copy into itself",
                "use a directory that does not hold clusterd's state (its `local` nodes live "
                "there)")

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        destination = os.path.expanduser(destination)
        self._refuse_copy_into_itself(source, destination)
        # A failed or interrupted copy leaves the workdir as it was, with no partial copy
        # beside it (see runtime/staging.py).
        async with staged(destination) as target:
            await rsync.run_or_fail(
                [rsync_binary(), *workdir_rsync_args(source), *target.rsync_args,
                 rsync_source(source), target.path + "/"],
                f"copying {source} to {self.node_name}", timeout_s=timeout_s,
                on_progress=on_progress, env=self._env)

    async def put_path(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        destination = os.path.expanduser(destination)
        self._refuse_copy_into_itself(source, destination)
        os.makedirs(os.path.dirname(destination.rstrip("/")) or "/", exist_ok=True)
        if os.path.isdir(source):
            os.makedirs(destination, exist_ok=True)
            destination = destination.rstrip("/") + "/"
        await rsync.run_or_fail(
            [rsync_binary(), *mount_rsync_args(), rsync_source(source), destination],
            f"copying {source} to {self.node_name}", timeout_s=timeout_s,
            on_progress=on_progress, env=self._env)
