"""One asyncssh connection per node, shared by every command, file copy and tunnel to it.

Connections are made on first use, kept alive with keepalives, and remade (with backoff)
when they die. Each carries a bound on concurrent channels below OpenSSH's MaxSessions
(default 10), so fifty concurrent commands queue for a slot instead of being refused.
Host keys are checked as host_keys.py says; a key met for the first time is announced
(`on_new_host_key`) with its fingerprint. A torn-down cluster's connections are dropped
(`forget`), with the pinned keys of cloud instances (their ids are never reused).

The pool also keeps its own view of each node (`link`): whether the connection is up, and if
it was lost, why and since when. That is the daemon's evidence about a node, besides what the
provider and Ray say: a node cut off from the network stops answering keepalives well before
Ray's health checks give up on it. A controller that wants to hear of that soon tightens the
keepalive of the nodes it watches (`watch`), so only those pay for the extra packets.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import functools
import re
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import anyio
import asyncssh

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.commands import CommandResult
from clusterd.concurrency import first_error
from clusterd.nodes import SSHTarget
from clusterd.ssh.errors import CONNECT_ERRORS, TRANSPORT_ERRORS, cannot_connect, connection_lost
from clusterd.ssh.host_keys import HostKeyStore, KnownKeys, fingerprint

logger = log.get("clusterd.ssh")

CHANNELS_PER_CONNECTION = 8
CONNECT_TIMEOUT_S = 15.0
CONNECT_ATTEMPTS = 4
KEEPALIVE_INTERVAL_S = 15.0
KEEPALIVE_COUNT_MAX = 3
WINDOW_BYTES = 8 * 1024 * 1024
MAX_PACKET_BYTES = 256 * 1024
# AES-GCM first (asyncssh's default puts ChaCha20-Poly1305 first): OpenSSL's AES-GCM is one
# call per packet on the CPU's AES instructions, where asyncssh's ChaCha20-Poly1305 is two. A
# 60 MB upload to a local sshd: 0.18 s against 0.34 s, half the daemon's CPU (every runtime
# install streams that much to each node). The rest stay, in asyncssh's order, for servers
# without it.
ENCRYPTION_ALGS = ("aes128-gcm@openssh.com", "aes256-gcm@openssh.com",
                   "chacha20-poly1305@openssh.com", "aes256-ctr", "aes192-ctr", "aes128-ctr")


# Told of a key met for the first time; returns whether a user was told (in a request).
NewKeyListener = Callable[[SSHTarget, str], Awaitable[bool]]


@dataclasses.dataclass
class NodeConnection:
    target: SSHTarget
    conn: asyncssh.SSHClientConnection
    slots: anyio.Semaphore
    host_key: str = ""  # its fingerprint
    # The key was met (and pinned) by this connection, and no user has been told yet.
    first_contact: bool = False

    @property
    def alive(self) -> bool:
        return not self.conn.is_closed()

    @contextlib.asynccontextmanager
    async def channel(self) -> AsyncIterator[asyncssh.SSHClientConnection]:
        """Hold one of the connection's channel slots while using the connection."""
        async with self.slots:
            yield self.conn


class LinkState(enum.StrEnum):
    UP = "up"  # a live connection
    LOST = "lost"  # the last connection died under us (not closed by the daemon)
    NONE = "none"  # no connection made by this daemon, or closed by it (a teardown, a drop)


@dataclasses.dataclass(frozen=True)
class Link:
    """The daemon's own view of its connection to one node."""

    state: LinkState
    reason: str = ""  # why it was lost
    since: float = 0.0  # when it was lost (time.monotonic())
    # Lost because the node stopped answering keepalives (not a reset or a close by it): it
    # was silent for keepalive interval x (count max + 1).
    silent: bool = False


class _LinkWatch(asyncssh.SSHClient):
    """Tells the pool when its connection dies under it (asyncssh's client callback)."""

    def __init__(self, on_lost: Callable[[asyncssh.SSHClientConnection, Exception], None]
                 ) -> None:
        self._on_lost = on_lost
        self._conn: asyncssh.SSHClientConnection | None = None

    def connection_made(self, conn: asyncssh.SSHClientConnection) -> None:
        self._conn = conn

    def connection_lost(self, exc: Exception | None) -> None:
        # None: closed by us (a drop, a teardown), which is no news about the node.
        if exc is not None and self._conn is not None:
            self._on_lost(self._conn, exc)


def expand_proxy_command(target: SSHTarget) -> str:
    """OpenSSH's tokens in a ProxyCommand: %h host, %p port, %r user, %% a percent sign."""
    assert target.proxy_command is not None
    values = {"h": target.host, "p": str(target.port), "r": target.user, "%": "%"}
    return re.sub(r"%([hpr%])", lambda m: values[m.group(1)], target.proxy_command)


@contextlib.contextmanager
def stopped_if_abandoned(process: asyncssh.SSHClientProcess[Any]) -> Iterator[None]:
    """A remote command whose caller gives up on it (cancelled: a launch called off, a
    timeout) is stopped on the node, not left running there with nobody to read it: SIGTERM
    to its process group (OpenSSH's sshd signals the session's group), then its channel is
    closed. Both only queue messages, so this never waits, even for a node that hangs."""
    try:
        yield
    except BaseException:
        if process.exit_status is None and process.exit_signal is None:
            with contextlib.suppress(OSError, asyncssh.Error):
                process.send_signal("TERM")
        process.close()
        raise


class SSHConnections:
    def __init__(self, host_keys: HostKeyStore,
                 on_new_host_key: NewKeyListener | None = None) -> None:
        self._host_keys = host_keys
        self._connections: dict[SSHTarget, NodeConnection] = {}
        self._connecting: dict[SSHTarget, anyio.Lock] = {}
        self._lost: dict[SSHTarget, Link] = {}
        # (interval, count max) for nodes a controller watches (see `watch`).
        self._keepalive: dict[SSHTarget, tuple[float, int]] = {}
        self.on_new_host_key = on_new_host_key

    def link(self, target: SSHTarget) -> Link:
        """What the daemon's own connection to the node says of it. Never blocks."""
        node = self._connections.get(target)
        if node is not None and node.alive:
            return Link(LinkState.UP)
        return self._lost.get(target, Link(LinkState.NONE))

    def watch(self, target: SSHTarget, interval_s: float, count_max: int) -> None:
        """Keep the node's connection (this one, and every one made again) alive with
        keepalives every `interval_s`: a node silent for interval_s * (count_max + 1) has its
        connection closed, and `link` says LOST, silent. Idempotent; `forget` ends it."""
        if self._keepalive.get(target) == (interval_s, count_max):
            return
        self._keepalive[target] = (interval_s, count_max)
        node = self._connections.get(target)
        if node is not None and node.alive:
            node.conn.set_keepalive(interval_s, count_max)

    def _connection_lost(self, target: SSHTarget, conn: asyncssh.SSHClientConnection,
                         exc: Exception) -> None:
        node = self._connections.get(target)
        if node is None or node.conn is not conn:
            return  # an older connection, or one still being made (its caller hears of it)
        # asyncssh says so only in its message ("Server not responding to keepalive").
        silent = isinstance(exc, asyncssh.ConnectionLost) and "keepalive" in str(exc)
        reason = getattr(exc, "reason", None) or str(exc) or type(exc).__name__
        self._lost[target] = Link(LinkState.LOST, reason, time.monotonic(), silent)
        logger.info("ssh connection lost", node=str(target), reason=reason)

    async def get(self, target: SSHTarget, attempts: int = CONNECT_ATTEMPTS
                  ) -> NodeConnection:
        """The node's live connection, made if there is none (tried `attempts` times)."""
        existing = self._connections.get(target)
        if existing is not None and existing.alive:
            return existing
        lock = self._connecting.setdefault(target, anyio.Lock())
        async with lock:
            existing = self._connections.get(target)
            if existing is not None and existing.alive:
                return existing
            conn, key, first = await self._connect(target, attempts)
            node = NodeConnection(target, conn, anyio.Semaphore(CHANNELS_PER_CONNECTION),
                                  key, first)
            self._connections[target] = node
            self._lost.pop(target, None)
            if first and self.on_new_host_key is not None and (
                    await self.on_new_host_key(target, key)):
                node.first_contact = False  # announced
            return node

    async def wait_reachable(self, targets: Iterable[SSHTarget], *, attempt_s: float,
                             first_delay_s: float, max_delay_s: float) -> None:
        """Return once every target lets us in. New nodes whose sshd is still starting
        refuse or do not answer: tried again, backing off from first_delay_s to max_delay_s.
        A host key that is not the pinned one is no sshd starting: it is raised (the first
        error, not a group). The caller bounds the whole wait."""

        async def one(target: SSHTarget) -> None:
            delay = first_delay_s
            while True:
                try:
                    with anyio.fail_after(attempt_s):
                        await self.get(target)
                    return
                except (ProtocolError, TimeoutError) as exc:
                    if (isinstance(exc, ProtocolError)
                            and exc.code == ErrorCode.HOST_KEY_MISMATCH):
                        raise
                    logger.info("waiting for ssh", node=str(target))
                await anyio.sleep(delay)
                delay = min(delay * 2, max_delay_s)

        with first_error():
            async with anyio.create_task_group() as group:
                for target in targets:
                    group.start_soon(one, target)

    async def run(self, target: SSHTarget, command: str, *, input: bytes | Path | None = None,
                  timeout_s: float = 120, name: str | None = None) -> CommandResult:
        """Run a shell command line on the node, in one of its connection's channel slots;
        never raises for a non-zero exit. `input` is its stdin: bytes, or a local file
        streamed as it is read (the command may start on its first bytes). A connection that
        breaks under the command is dropped (the next use reconnects) and reported as
        NODE_UNREACHABLE."""
        node = await self.get(target)
        try:
            async with node.channel() as conn:
                process = await conn.create_process(
                    command, input=None if isinstance(input, Path) else input, encoding=None)
                with stopped_if_abandoned(process), anyio.fail_after(timeout_s):
                    async with anyio.create_task_group() as feeding:
                        if isinstance(input, Path):
                            feeding.start_soon(_feed, process, input)
                        done = await process.wait(check=False)
                        feeding.cancel_scope.cancel()
        except TimeoutError:
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"{name or target}: command did not finish within {timeout_s:.0f} s",
            ) from None
        except TRANSPORT_ERRORS as exc:
            await self.drop(target)
            raise connection_lost(target, exc) from None
        # No exit status means the remote side died by a signal or dropped the channel.
        code = done.exit_status if done.exit_status is not None else 255
        stdout = done.stdout if isinstance(done.stdout, bytes) else b""
        stderr = done.stderr if isinstance(done.stderr, bytes) else b""
        return CommandResult(code, stdout, stderr)

    async def _connect(self, target: SSHTarget, attempts: int
                       ) -> tuple[asyncssh.SSHClientConnection, str, bool]:
        delay = 0.5
        for attempt in range(1, attempts + 1):
            try:
                return await self._connect_once(target)
            except ProtocolError as exc:
                if exc.code in (ErrorCode.HOST_KEY_MISMATCH, ErrorCode.HOST_KEY_UNKNOWN) or (
                        attempt == attempts):
                    raise
                logger.info("ssh connect failed; retrying", node=str(target),
                            attempt=attempt, error=exc.message)
            await anyio.sleep(delay)
            delay *= 2
        raise AssertionError("unreachable")

    async def _connect_once(self, target: SSHTarget
                            ) -> tuple[asyncssh.SSHClientConnection, str, bool]:
        """A connection, the fingerprint of the host key it accepted, and whether that key was
        met for the first time (and pinned)."""
        pinned = self._host_keys.pinned(target.key_name, target.port)
        # A cloud instance is known by its id (the alias), which no file of the user's names.
        user = (self._host_keys.known_by_user(target.host, target.port)
                if not pinned and not target.host_key_alias else None)
        if pinned:
            known_hosts: Any = (pinned, [], list(user.revoked) if user else [])
        elif user:
            known_hosts = (list(user.keys), list(user.authorities), list(user.revoked))
        elif target.strict_host_keys:
            known_hosts = ([], [], [])  # nothing is known, and nothing may be trusted
        else:
            known_hosts = None  # first contact: trusted, then pinned and announced
        keepalive = self._keepalive.get(target, (KEEPALIVE_INTERVAL_S, KEEPALIVE_COUNT_MAX))
        options: dict[str, Any] = {
            "port": target.port,
            "username": target.user,
            "client_keys": [target.identity_file] if target.identity_file else (),
            "known_hosts": known_hosts,
            "keepalive_interval": keepalive[0],
            "keepalive_count_max": keepalive[1],
            "client_factory": functools.partial(
                _LinkWatch, functools.partial(self._connection_lost, target)),
            "agent_path": None,
            "config": None,
            "connect_timeout": CONNECT_TIMEOUT_S,
            # Bigger packets and window: a log flood through the tunnel costs Python per
            # packet, so fewer, larger ones keep up with OpenSSH.
            "window": WINDOW_BYTES,
            "max_pktsize": MAX_PACKET_BYTES,
            "encryption_algs": list(ENCRYPTION_ALGS),
        }
        if target.proxy_command:
            options["proxy_command"] = expand_proxy_command(target)
        try:
            with anyio.fail_after(CONNECT_TIMEOUT_S + 5):
                conn = await asyncssh.connect(target.host, **options)
        except asyncssh.HostKeyNotVerifiable:
            raise await self._refused_key(target, bool(pinned), user) from None
        except CONNECT_ERRORS as exc:
            raise cannot_connect(target, exc) from None
        key = conn.get_server_host_key()
        first = False
        by_authority = user is not None and bool(user) and key is not None and not any(
            k.get_fingerprint() == key.get_fingerprint() for k in user.keys)
        if key is not None and not pinned and not by_authority:
            # A host vouched for by a CA's certificate is checked against it every time:
            # nothing to pin (its certificates, and keys, may change).
            self._host_keys.pin(target.key_name, target.port, key)
            first = not user
            logger.info("pinned host key", node=str(target),
                        fingerprint=fingerprint(key), seen_before=not first)
        logger.info("ssh connected", node=str(target))
        return conn, fingerprint(key) if key is not None else "", first

    async def _refused_key(self, target: SSHTarget, pinned: bool,
                           user: KnownKeys | None) -> ProtocolError:
        where = f"{target.host}:{target.port}"
        offered = ""
        with contextlib.suppress(Exception), anyio.move_on_after(10):
            key = await asyncssh.get_server_host_key(
                target.host, target.port,
                proxy_command=expand_proxy_command(target) if target.proxy_command else ())
            if key is not None:
                offered = f" (it offers {fingerprint(key)})"
        if pinned or user:
            source = (f"the one pinned on first contact ({self._host_keys.path})" if pinned
                      else "the one your known_hosts files give it")
            return ProtocolError(
                ErrorCode.HOST_KEY_MISMATCH,
                f"the host key of {where}{offered} is not {source}; refusing to connect "
                "(someone may be impersonating the host)",
                f"if the host was rebuilt, delete its line from {self._host_keys.path}"
                if pinned else "if the host was rebuilt, update ~/.ssh/known_hosts "
                f"(ssh-keygen -R {target.host})",
            )
        return ProtocolError(
            ErrorCode.HOST_KEY_UNKNOWN,
            f"the host key of {where}{offered} is not known, and its pool has "
            "strict_host_key_checking: true",
            f"check the key out of band, then add it: ssh-keyscan -p {target.port} "
            f"{target.host} >> ~/.ssh/known_hosts",
        )

    async def forget(self, targets: list[SSHTarget]) -> None:
        """A cluster is gone: drop its nodes' connections, and the pinned keys of cloud
        instances (known by their ids, which are never reused)."""
        for target in targets:
            await self.drop(target)
            self._lost.pop(target, None)
            self._keepalive.pop(target, None)
            if target.host_key_alias:
                self._host_keys.forget(target.key_name, target.port)

    async def drop(self, target: SSHTarget) -> None:
        node = self._connections.pop(target, None)
        lock = self._connecting.get(target)
        if lock is not None and not lock.locked():
            del self._connecting[target]
        if node is not None:
            node.conn.close()
            with anyio.move_on_after(5, shield=True):
                await node.conn.wait_closed()

    async def close_all(self) -> None:
        for target in list(self._connections):
            await self.drop(target)


FEED_CHUNK_BYTES = 256 * 1024


async def _feed(process: asyncssh.SSHClientProcess[bytes], source: Path) -> None:
    """`source`'s bytes to the command's stdin as they are read, then end of file. A command
    that stops reading ends the feeding: its exit status says why. A file that cannot be read
    sends nothing: the command sees an empty stdin (whoever streams one checks what came)."""
    try:
        file = await anyio.open_file(source, "rb")
    except OSError as exc:
        logger.warning("cannot read the file to stream", path=str(source), error=str(exc))
        process.stdin.write_eof()
        return
    async with file:
        try:
            while chunk := await file.read(FEED_CHUNK_BYTES):
                process.stdin.write(chunk)
                await process.stdin.drain()
            process.stdin.write_eof()
        except (BrokenPipeError, ConnectionError, asyncssh.Error):
            pass
