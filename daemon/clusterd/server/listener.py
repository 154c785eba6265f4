"""The control socket: a Unix socket only its owner can reach, or one systemd passed us.

Protection is layered: the directory is ours and 0700 (anything else is refused, never
repaired: see clusterctl._private), the socket 0600, and each connection's peer uid is
checked (SO_PEERCRED) in case either mode was loosened. A socket systemd passes must be a
Unix stream socket: on any other kind the peer check would mean nothing.
"""

from __future__ import annotations

import contextlib
import errno
import os
import resource
import socket
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio
import anyio.abc

from clusterctl import protocol
from clusterctl._private import ensure_private_dir
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.server.stream import BufferedSocketStream

logger = log.get("clusterd.listener")
SD_LISTEN_FDS_START = 3
# Out of descriptors (or memory) while accepting: wait and try again, never die of it.
RESOURCE_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM})
ACCEPT_RETRY_S = (0.05, 1.0)
MAX_OPEN_FILES = 65536


class SocketInUse(RuntimeError):
    pass


class UnsafeListener(RuntimeError):
    """systemd passed a socket the daemon must not serve (not a Unix stream socket)."""


def systemd_sockets() -> list[socket.socket]:
    """Sockets passed by systemd socket activation (LISTEN_PID/LISTEN_FDS), if any are ours."""
    if os.environ.get("LISTEN_PID") != str(os.getpid()):
        return []
    try:
        count = int(os.environ.get("LISTEN_FDS", "0"))
    except ValueError:
        return []
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)  # not for our children
    sockets = []
    for fd in range(SD_LISTEN_FDS_START, SD_LISTEN_FDS_START + count):
        os.set_inheritable(fd, False)
        sock = socket.socket(fileno=fd)
        if sock.family != socket.AF_UNIX or sock.type != socket.SOCK_STREAM:
            kind = f"{socket.AddressFamily(sock.family).name}/{sock.type.name}"
            sock.close()
            raise UnsafeListener(
                f"systemd passed a {kind} socket (fd {fd}); clusterd serves only a Unix "
                "stream socket, where it can check who connects (ListenStream=%t/clusterd/"
                "clusterd.sock in clusterd.socket)")
        sockets.append(sock)
    return sockets


def prepare_directory(path: Path) -> None:
    """The socket's directory: made 0700 if missing, refused if it is not ours and private."""
    ensure_private_dir(str(path))


def _answers(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        probe.settimeout(1)
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


async def open_listener(socket_path: Path) -> tuple[anyio.abc.SocketListener, bool]:
    """The listener, and whether systemd owns its socket file (then we must not remove it)."""
    activated = systemd_sockets()
    if activated:
        logger.info("using the socket systemd passed", fd=activated[0].fileno())
        activated[0].setblocking(False)
        return await anyio.abc.SocketListener.from_socket(activated[0]), True
    prepare_directory(socket_path.parent)
    if socket_path.exists() or socket_path.is_symlink():
        if _answers(socket_path):
            raise SocketInUse(f"another clusterd is serving {socket_path}")
        socket_path.unlink()  # left by a daemon that died
    listener = await anyio.create_unix_listener(socket_path, mode=0o600)
    logger.info("listening", socket=str(socket_path))
    return listener, False


def remove_socket(socket_path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        socket_path.unlink()


def raise_open_files_limit() -> int:
    """Lift the soft limit on open files to the hard one (capped): every client connection,
    SSH connection and tunnel holds one. Returns the soft limit now in force."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = min(hard if hard != resource.RLIM_INFINITY else MAX_OPEN_FILES, MAX_OPEN_FILES)
    if wanted > soft:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))
            soft = wanted
    return soft


def connection_cap(configured: int) -> int:
    """How many clients to serve at once: as configured, else a quarter of the open-files
    limit (the rest is for SSH connections, tunnels, the database and child processes)."""
    if configured > 0:
        return configured
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    return max(8, min(1000, soft // 4))


Handler = Callable[[BufferedSocketStream], Awaitable[None]]


async def _refuse(stream: anyio.abc.SocketStream, cap: int) -> None:
    error = ProtocolError(ErrorCode.TOO_MANY_CONNECTIONS,
                          f"clusterd is serving {cap} connections, its limit",
                          "close idle clients, or raise CLUSTERD_MAX_CONNECTIONS")
    async with stream:
        with contextlib.suppress(Exception), anyio.move_on_after(1):
            await stream.send(protocol.encode_frame(protocol.connection_error(error)))


async def serve_connections(listener: anyio.abc.SocketListener, handler: Handler,
                            cap: int) -> None:
    """Accept clients and serve each in a task of its own, at most `cap` at once (others get
    TOO_MANY_CONNECTIONS); out of descriptors, back off and keep going (the connections
    holding them end, or time out when idle)."""
    active = 0
    delay = ACCEPT_RETRY_S[0]

    async def serve_one(accepted: anyio.abc.SocketStream) -> None:
        nonlocal active
        try:
            try:
                stream = await BufferedSocketStream.taking_over(accepted)
            except OSError as exc:  # reset already
                logger.info("dropped a connection as it came", error=str(exc))
                return
            if stream is not None:
                await handler(stream)
        finally:
            active -= 1

    async with anyio.create_task_group() as group:
        while True:
            try:
                stream = await listener.accept()
            except anyio.BrokenResourceError as exc:
                cause = exc.__cause__
                if not isinstance(cause, OSError) or cause.errno not in RESOURCE_ERRORS:
                    raise
                if delay == ACCEPT_RETRY_S[0]:
                    logger.warning("cannot accept a connection; retrying", error=str(cause),
                                   active=active)
                await anyio.sleep(delay)
                delay = min(delay * 2, ACCEPT_RETRY_S[1])
                continue
            delay = ACCEPT_RETRY_S[0]
            if active >= cap:
                group.start_soon(_refuse, stream, cap)
                continue
            active += 1
            group.start_soon(serve_one, stream)
