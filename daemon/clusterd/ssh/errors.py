"""asyncssh's errors, mapped to the daemon's in one place (as httpcore's `map_exceptions`).

Every failure of the SSH transport (a socket's `OSError`, any `asyncssh.Error`) met while
connecting, running a command, copying a file or opening a tunnel becomes a `ProtocolError`
with a stable code here; no other module names asyncssh's exception classes to turn them into
the daemon's errors. (Suppressing them while cleaning up, where nothing is reported, is not
mapping.)"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable

import asyncssh

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget

# What the SSH transport raises when a node cannot be reached or a connection breaks.
TRANSPORT_ERRORS: tuple[type[Exception], ...] = (OSError, asyncssh.Error)
# ... and, while connecting, the connect timeout running out.
CONNECT_ERRORS: tuple[type[Exception], ...] = (*TRANSPORT_ERRORS, TimeoutError)


def reason(exc: BaseException) -> str:
    """asyncssh's own reason for `exc`, else its text, else its type's name."""
    return getattr(exc, "reason", None) or str(exc) or type(exc).__name__


def connection_lost(target: SSHTarget, exc: BaseException) -> ProtocolError:
    """A connection that was up broke (a command, a copy, a channel failed on it)."""
    return ProtocolError(
        ErrorCode.NODE_UNREACHABLE,
        f"lost the connection to {target}: {reason(exc)}",
        "it is retried on the next request; check the host if it keeps happening",
    )


def cannot_connect(target: SSHTarget, exc: BaseException) -> ProtocolError:
    """A connection could not be made (refused, timed out, our key not accepted)."""
    if isinstance(exc, asyncssh.PermissionDenied):
        return ProtocolError(
            ErrorCode.NODE_UNREACHABLE,
            f"{target} refused our key: {exc.reason}",
            "check user and identity_file in ssh_node_pools.yaml",
        )
    return ProtocolError(
        ErrorCode.NODE_UNREACHABLE,
        f"cannot reach {target}: {reason(exc)}",
        "check that the host is up and its sshd listens on that port",
    )


@contextlib.asynccontextmanager
async def mapped(error: Callable[[BaseException], ProtocolError],
                 drop: Callable[[], Awaitable[None]] | None = None) -> AsyncIterator[None]:
    """Transport errors raised in the block become `error(exc)`, raised without asyncssh's
    traceback. `drop` first forgets the connection they broke, so the next request makes a
    new one instead of failing on the dead one."""
    try:
        yield
    except TRANSPORT_ERRORS as exc:
        if drop is not None:
            await drop()
        raise error(exc) from None
