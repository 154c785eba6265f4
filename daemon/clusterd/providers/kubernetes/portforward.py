"""Port-forwards to pods through the Kubernetes API server, owned by the daemon (SkyPilot's
default way to reach pods, `networking_mode: portforward`).

Each pod port gets a Unix socket in the daemon's private runtime directory; every connection
accepted there is carried over a websocket of its own to the API server's `portforward`
subresource (`v4.channel.k8s.io`: each frame starts with its channel, 0 for data and 1 for
errors; each channel's first frame names the port). SSH reaches the socket through a
ProxyCommand (`python -m clusterd.ssh.unix_connect SOCKET`), so the daemon's own connections
and the user's `ssh CLUSTER` alike go through it, and nothing listens on TCP.

A socket outlives the connections through it: when the API server drops them (it restarted),
the SSH connection over it breaks, the daemon's connection manager reconnects, and the new
connection gets a new websocket. Each websocket is opened with the context's credentials of
the moment (the opener is KubeApi.portforward: refreshed before they expire, and opened again
once on a 401), so tokens that expire (EKS's 15 minutes) never stop new connections; one
already open is not cut when its token expires. Sockets are served from `run`, a task of the
daemon's root task group; `close` ends one (its cluster went away).
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
import anyio
import anyio.abc

from clusterd import log

logger = log.get("clusterd.kubernetes.portforward")

DATA, ERROR = 0, 1
OPEN_TIMEOUT_S = 20.0
CHUNK = 65536


@dataclasses.dataclass(frozen=True)
class PodPort:
    context: str
    namespace: str
    pod: str
    port: int = 22

    def __str__(self) -> str:
        return f"{self.context}/{self.namespace}/{self.pod}:{self.port}"


# Opens the websocket of one forwarded connection (an async context manager around it).
Opener = Callable[[PodPort], Awaitable[Any]]


class PortForwards:
    def __init__(self, directory: Path, opener: Opener) -> None:
        self._directory = directory
        self._opener = opener
        self._group: anyio.abc.TaskGroup | None = None
        self._served: dict[PodPort, anyio.CancelScope] = {}
        self._lock = anyio.Lock()

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        """Serve the sockets until cancelled (the daemon stops)."""
        async with anyio.create_task_group() as group:
            self._group = group
            task_status.started()
            try:
                await anyio.sleep_forever()
            finally:
                self._group = None
                for path in self._directory.glob("*.sock"):
                    with contextlib.suppress(OSError):
                        path.unlink()

    def socket_path(self, target: PodPort) -> Path:
        # Short and fixed-length: a Unix socket's path must stay under 108 bytes.
        digest = hashlib.sha256(str(target).encode()).hexdigest()[:20]
        return self._directory / f"{digest}.sock"

    async def ensure(self, target: PodPort) -> Path:
        """The socket that reaches target, served from now on. Idempotent."""
        async with self._lock:
            path = self.socket_path(target)
            if target in self._served and path.exists():
                return path
            if self._group is None:
                raise RuntimeError("port-forwards are not being served (PortForwards.run)")
            self._directory.mkdir(parents=True, exist_ok=True, mode=0o700)
            with contextlib.suppress(FileNotFoundError):
                path.unlink()  # left by a daemon that died
            listener = await anyio.create_unix_listener(path, mode=0o600)
            scope = anyio.CancelScope()
            self._served[target] = scope
            self._group.start_soon(self._serve, target, listener, scope)
            logger.info("port-forward ready", target=str(target), socket=str(path))
            return path

    async def close(self, keep: Callable[[PodPort], bool]) -> None:
        """Stop serving every target keep() says no to (a cluster's pods went away)."""
        async with self._lock:
            for target in [t for t in self._served if not keep(t)]:
                self._served.pop(target).cancel()
                with contextlib.suppress(FileNotFoundError):
                    self.socket_path(target).unlink()

    async def _serve(self, target: PodPort, listener: anyio.abc.SocketListener,
                     scope: anyio.CancelScope) -> None:
        with scope:
            async with listener, anyio.create_task_group() as connections:
                while True:
                    stream = await listener.accept()
                    connections.start_soon(self._forward, target, stream)

    async def _forward(self, target: PodPort, stream: anyio.abc.SocketStream) -> None:
        """One connection: bytes both ways until either side ends."""
        async with stream:
            try:
                with anyio.fail_after(OPEN_TIMEOUT_S):
                    opening = await self._opener(target)
                    ws = await opening.__aenter__()
            except Exception as exc:
                logger.warning("port-forward failed to open", target=str(target),
                               error=str(exc) or type(exc).__name__)
                return
            try:
                async with anyio.create_task_group() as group:
                    group.start_soon(_upstream, stream, ws, group.cancel_scope)
                    await _downstream(ws, stream, target)
                    group.cancel_scope.cancel()
            except (aiohttp.ClientError, anyio.BrokenResourceError,
                    anyio.ClosedResourceError, OSError) as exc:
                logger.info("port-forward connection ended", target=str(target),
                            error=str(exc) or type(exc).__name__)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(5):
                    await opening.__aexit__(None, None, None)


async def _upstream(stream: anyio.abc.SocketStream, ws: Any, done: anyio.CancelScope) -> None:
    """The local side's bytes to the pod, on the data channel."""
    try:
        while True:
            data = await stream.receive(CHUNK)
            await ws.send_bytes(bytes([DATA]) + data)
    except (anyio.EndOfStream, anyio.BrokenResourceError, anyio.ClosedResourceError):
        done.cancel()  # the local side is done: so is the connection


async def _downstream(ws: Any, stream: anyio.abc.SocketStream, target: PodPort) -> None:
    """The pod's bytes to the local side; returns when the websocket ends. Each channel's
    first frame is the port it carries, not data."""
    headers_seen: set[int] = set()
    async for message in ws:
        if message.type != aiohttp.WSMsgType.BINARY or not message.data:
            if message.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED,
                                aiohttp.WSMsgType.ERROR):
                return
            continue
        channel, payload = message.data[0], message.data[1:]
        if channel not in headers_seen:
            headers_seen.add(channel)
            payload = payload[2:]  # the port, 2 bytes little-endian
        if not payload:
            continue
        if channel == DATA:
            await stream.send(payload)
        elif channel == ERROR:
            logger.warning("the API server could not forward", target=str(target),
                           error=payload.decode(errors="replace")[:400])
            return
