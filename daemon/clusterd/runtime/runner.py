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
from clusterd.commands import CommandResult, ignore_filters, rsync_binary


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

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600) -> None:
        """Make `destination` on the node hold the files of local directory `source`,
        honouring .skyignore/.gitignore. Raises ProtocolError on failure."""
        ...

    async def put_path(self, source: str, destination: str, *, timeout_s: float = 600) -> None:
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

    async def _rsync(self, args: list[str], what: str, timeout_s: float) -> None:
        result = await self.run([rsync_binary(), *args], timeout_s=timeout_s)
        if result.exit_code != 0:
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"copying {what} to {self.node_name} failed (rsync exit {result.exit_code}): "
                f"{result.error_tail(5)}",
            )

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600) -> None:
        destination = os.path.expanduser(destination)
        os.makedirs(destination, exist_ok=True)
        await self._rsync(
            ["-a", "--delete", *ignore_filters(source), source.rstrip("/") + "/", destination],
            source, timeout_s,
        )

    async def put_path(self, source: str, destination: str, *, timeout_s: float = 600) -> None:
        destination = os.path.expanduser(destination)
        os.makedirs(os.path.dirname(destination.rstrip("/")) or "/", exist_ok=True)
        if os.path.isdir(source):
            os.makedirs(destination, exist_ok=True)
            await self._rsync(["-a", source.rstrip("/") + "/", destination], source, timeout_s)
        else:
            await self._rsync(["-a", source, destination], source, timeout_s)
