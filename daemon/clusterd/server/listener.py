"""The control socket: a Unix socket only its owner can reach, or one systemd passed us.

Protection is layered: the directory is 0700, the socket 0600, and each connection's peer
uid is checked (SO_PEERCRED) in case either mode was loosened.
"""

from __future__ import annotations

import contextlib
import os
import socket
import stat
from pathlib import Path

import anyio
import anyio.abc

from clusterd import log

logger = log.get("clusterd.listener")
SD_LISTEN_FDS_START = 3


class SocketInUse(RuntimeError):
    pass


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
        sockets.append(socket.socket(fileno=fd))
    return sockets


def prepare_directory(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    info = path.stat()
    if info.st_uid != os.getuid():
        raise PermissionError(f"{path} belongs to uid {info.st_uid}, not to you")
    if stat.S_IMODE(info.st_mode) != 0o700:
        path.chmod(0o700)


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
