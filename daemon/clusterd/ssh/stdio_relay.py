"""Relay this process's stdin and stdout to a connected socket, both ways, until the socket
closes: the body of the small programs ssh and rsync start as a ProxyCommand or a remote
shell, which hand a connection over to the daemon. Standard library only: they start once per
connection, and must start fast."""

from __future__ import annotations

import contextlib
import os
import socket
import threading

CHUNK = 65536


def _upstream(sock: socket.socket) -> None:
    try:
        while data := os.read(0, CHUNK):
            sock.sendall(data)
    finally:
        with contextlib.suppress(OSError):
            sock.shutdown(socket.SHUT_WR)


def relay(sock: socket.socket) -> None:
    """stdin to sock (in a thread), sock to stdout; returns when sock has no more to say."""
    threading.Thread(target=_upstream, args=(sock,), daemon=True).start()
    while data := sock.recv(CHUNK):
        view = memoryview(data)
        while view:
            view = view[os.write(1, view):]
