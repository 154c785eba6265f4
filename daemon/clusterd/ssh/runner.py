"""CommandRunner over the daemon's SSH connection to a node.

Commands run on the node's shell through the shared connection. A command line too long for
the remote side goes through an uploaded script instead: straight away above a size
threshold, and after the fact when the node (or a proxy in front of it) answers with a
"too long" failure, as SkyPilot does. File copies are rsync, with this daemon's connection as
rsync's transport (see rsync_shell).
"""

from __future__ import annotations

import contextlib
import json
import secrets
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

import anyio
import anyio.abc
import asyncssh
from anyio.streams.buffered import BufferedByteReceiveStream

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log, rsync
from clusterd.commands import (
    CommandResult,
    mount_rsync_args,
    rsync_binary,
    rsync_source,
    workdir_rsync_args,
)
from clusterd.concurrency import first_error
from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import NodeConnection, SSHConnections, stopped_if_abandoned
from clusterd.ssh.errors import connection_lost, mapped

logger = log.get("clusterd.ssh.runner")

# Above this, a command goes through a file at once (Linux caps one argument at 128 KiB).
INLINE_LIMIT_BYTES = 100 * 1024
REMOTE_TMP = ".clusterd/tmp"
# rsync_shell's first line: the remote command, as JSON.
MAX_RELAY_HEADER_BYTES = 64 * 1024
PROXY_TOO_LONG = ("request-uri too large", "request header fields too large", "400 bad request")


def is_message_too_long(exit_code: int, output: str) -> bool:
    """The node refused the command for its length, not for what it does: ssh itself (255,
    "too long"), the remote shell's exec (1, "Argument list too long": E2BIG), or a proxy in
    front of the node (1, an HTTP-ish refusal)."""
    text = output.lower()
    if exit_code == 255 and "too long" in text:
        return True
    if exit_code == 1 and "argument list too long" in text:
        return True
    return exit_code == 1 and any(marker in text for marker in PROXY_TOO_LONG)


class SSHRunner:
    def __init__(
        self,
        connections: SSHConnections,
        target: SSHTarget,
        node_name: str,
        python: str,
        relay_dir: Path,
    ) -> None:
        self._connections = connections
        self.target = target
        self.node_name = node_name
        self.python = python
        self._relay_dir = relay_dir

    async def _node(self) -> NodeConnection:
        return await self._connections.get(self.target)

    async def run(
        self, argv: Sequence[str], *, input: bytes | Path | None = None, timeout_s: float = 120
    ) -> CommandResult:
        return await self.run_shell(shlex.join(argv), input=input, timeout_s=timeout_s)

    async def run_shell(
        self, command: str, *, input: bytes | Path | None = None, timeout_s: float = 120
    ) -> CommandResult:
        """Run a shell command line (a script, even) as it is: the node's shell gets it as one
        argument, so one too long for that goes through an uploaded file instead."""
        if len(command.encode()) > INLINE_LIMIT_BYTES:
            return await self._run_via_file(command, input, timeout_s)
        result = await self._exec(command, input, timeout_s)
        output = (result.stderr + result.stdout).decode(errors="replace")
        if is_message_too_long(result.exit_code, output):
            logger.info("command too long for the node; retrying through a file",
                        node=self.node_name, bytes=len(command))
            return await self._run_via_file(command, input, timeout_s)
        return result

    async def _exec(self, command: str, input: bytes | Path | None, timeout_s: float
                    ) -> CommandResult:
        return await self._connections.run(self.target, command, input=input,
                                           timeout_s=timeout_s, name=self.node_name)

    async def _run_via_file(
        self, command: str, input: bytes | Path | None, timeout_s: float
    ) -> CommandResult:
        path = f"{REMOTE_TMP}/cmd-{secrets.token_hex(8)}.sh"
        node = await self._node()
        async with (mapped(lambda exc: connection_lost(self.target, exc),
                           drop=lambda: self._connections.drop(self.target)),
                    node.channel() as conn, conn.start_sftp_client() as sftp):
            await sftp.makedirs(REMOTE_TMP, exist_ok=True)
            async with sftp.open(path, "w") as script:
                await script.write(command + "\n")
        return await self._exec(
            f"bash {shlex.quote(path)}; status=$?; rm -f {shlex.quote(path)}; exit $status",
            input, timeout_s,
        )

    # -- files ------------------------------------------------------------------------------

    async def sync_dir(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        await self._mkdir(destination)
        await self._rsync(
            [*workdir_rsync_args(source), rsync_source(source),
             f"node:{_remote_path(destination)}/"],
            source, timeout_s, on_progress,
        )

    async def _mkdir(self, path: str) -> None:
        """`mkdir -p` on the node: relative to the login directory for `~/...` (only at the
        start of the path), `--` before the path."""
        done = await self.run(["mkdir", "-p", "--", _remote_path(path) or "."], timeout_s=60)
        if done.exit_code != 0:
            raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                                f"mkdir {path} on {self.node_name} failed: {done.error_tail(3)}")

    async def put_path(self, source: str, destination: str, *, timeout_s: float = 600,
                       on_progress: rsync.ProgressHook | None = None) -> None:
        parent = destination.rstrip("/").rsplit("/", 1)[0] if "/" in destination else "."
        await self._mkdir(parent or "/")
        remote = f"node:{_remote_path(destination)}"
        if Path(source).is_dir():
            remote += "/"
        await self._rsync([*mount_rsync_args(), rsync_source(source), remote], source,
                          timeout_s, on_progress)

    async def _rsync(self, args: list[str], what: str, timeout_s: float,
                     on_progress: rsync.ProgressHook | None) -> None:
        self._relay_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        socket_path = self._relay_dir / f"rsync-{secrets.token_hex(6)}.sock"
        shell = f"{shlex.quote(sys.executable)} -m clusterd.ssh.rsync_shell {socket_path}"
        listener = await anyio.create_unix_listener(socket_path, mode=0o600)
        remote_errors: list[str] = []
        try:
            with first_error():
                async with anyio.create_task_group() as group:
                    group.start_soon(self._relay_one, listener, remote_errors)
                    try:
                        # -s (--secluded-args): file names go to the node's rsync inside
                        # its protocol, never through a shell there, whatever this rsync's
                        # version.
                        result = await rsync.run([rsync_binary(), "-s", "-e", shell, *args],
                                                 timeout_s=timeout_s, on_progress=on_progress)
                    except TimeoutError:
                        raise rsync.timed_out(f"copying {what} to {self.node_name}",
                                              timeout_s) from None
                    group.cancel_scope.cancel()
        finally:
            with contextlib.suppress(Exception):
                await listener.aclose()
            socket_path.unlink(missing_ok=True)
        if result.exit_code != 0:
            said = "\n".join([*remote_errors, result.stderr.decode(errors="replace")])
            raise rsync.failure(f"copying {what} to {self.node_name}", result.exit_code,
                                said[-500:])

    async def _relay_one(self, listener: anyio.abc.SocketListener,
                         remote_errors: list[str]) -> None:
        """Serve the one connection rsync's shell makes: run its command on the node and
        pump bytes both ways until the remote side is done; what the node's rsync said on
        stderr, if it failed, goes to `remote_errors`."""
        stream = await listener.accept()
        async with stream:
            incoming = BufferedByteReceiveStream(stream)
            header = await incoming.receive_until(b"\n", MAX_RELAY_HEADER_BYTES)
            # As ssh does: the words joined by spaces, for the node's shell to split again.
            # rsync has already quoted each for that shell (its default since 3.2.4), so this
            # is the one layer of quoting; shlex.join would add a second, and `a b` would
            # arrive as `a\ b`.
            command = " ".join(json.loads(header))
            node = await self._node()
            async with node.channel() as conn:
                process = await conn.create_process(command, encoding=None)
                with stopped_if_abandoned(process):
                    await self._pump(stream, incoming, process, remote_errors)

    async def _pump(self, stream: anyio.abc.SocketStream, incoming: BufferedByteReceiveStream,
                    process: asyncssh.SSHClientProcess[bytes],
                    remote_errors: list[str]) -> None:
        async with anyio.create_task_group() as pumps:
            pumps.start_soon(_pump_in, incoming, process)
            while data := await process.stdout.read(65536):
                await stream.send(data)
            pumps.cancel_scope.cancel()
        errors = await process.stderr.read()
        await process.wait()
        if process.exit_status:
            said = errors.decode(errors="replace").strip()
            remote_errors.append(said)
            logger.warning("remote rsync failed", node=self.node_name,
                           status=process.exit_status, stderr=said[-300:])


async def _pump_in(stream: anyio.abc.ByteReceiveStream,
                   process: asyncssh.SSHClientProcess[bytes]) -> None:
    try:
        while True:
            data = await stream.receive(65536)
            process.stdin.write(data)
            await process.stdin.drain()
    except (anyio.EndOfStream, anyio.BrokenResourceError):
        process.stdin.write_eof()


def _remote_path(path: str) -> str:
    """A path as the node's login directory sees it: `~` (and `~/` at the start only) is
    that directory."""
    if path == "~":
        return "."
    return path[2:] if path.startswith("~/") else path
