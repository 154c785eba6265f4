"""An asyncio client for the clusterd control socket, for tools that live in an event loop
(the dashboard is one). The same protocol and the same checks before connecting as
`clusterctl.Client`, with many requests and streams in flight on one connection at once:

    async with AsyncClient() as client:
        print(await client.call(StatusArgs()))
        async with client.stream(LogsArgs(cluster="dev", job_id=3)) as stream:
            async for name, data in stream:
                ...
        print(stream.result)

Leaving a stream's `async with` before its final reply sends `cancel` (the daemon stops
relaying; the work goes on). It never starts a daemon: use `Client().connect()` first for
that. Imported only by those who use it (asyncio costs clusterctl's start-up too much).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
from collections.abc import AsyncIterator, Awaitable
from types import TracebackType
from typing import Any, TypeVar

from clusterctl import paths, protocol
from clusterctl.client import CLIENT_NAME, Client, ClusterdError, DaemonUnavailable, result_of
from clusterctl.protocol import ErrorCode, OpArgs

__all__ = ["AsyncClient", "AsyncStream"]

RECEIVE_BYTES = 256 * 1024
# Frames buffered per request before the reader waits for its consumer: a stream nobody reads
# holds up the whole connection rather than filling memory. Give a slow consumer (a log
# relayed to a browser) a connection of its own.
QUEUE_FRAMES = 64
CLOSE_TIMEOUT_S = 2.0  # to see a closed connection through (wait_closed)

T = TypeVar("T")


async def within(awaitable: Awaitable[T], timeout_s: float) -> T:
    """`awaitable`, or TimeoutError after timeout_s. Not asyncio.wait_for on 3.11: its wait
    drops a cancellation that comes as the awaited thing finishes (CPython gh-86296), and a
    task that loses its cancellation runs on: the dashboard ignored Ctrl-C that way when it
    came as a feed's connection was made. 3.10 (a node's Python may be) has no
    asyncio.timeout, and wait_for is all there is."""
    if sys.version_info < (3, 11):
        return await asyncio.wait_for(awaitable, timeout_s)
    async with asyncio.timeout(timeout_s):
        return await awaitable


class AsyncStream:
    """The event frames of one request; `result` holds its final reply's result."""

    def __init__(self, client: AsyncClient, args: OpArgs) -> None:
        self._client = client
        self._args = args
        self.request_id: int | None = None
        self.result: dict[str, Any] | None = None
        self._queue: asyncio.Queue[dict[str, Any] | BaseException] | None = None
        self._finished = False

    async def __aenter__(self) -> AsyncStream:
        self.request_id, self._queue = await self._client._submit(self._args)
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        if self.request_id is not None and not self._finished:
            await self._client._cancel(self.request_id)

    @property
    def pending_frames(self) -> int:
        """Frames of this request received and not yet consumed (batching consumers send
        what they have once this is 0)."""
        return self._queue.qsize() if self._queue is not None else 0

    def __aiter__(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        return self._events()

    async def _events(self) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        assert self._queue is not None, "use `async with client.stream(...)` first"
        while not self._finished:
            message = await self._queue.get()
            if isinstance(message, BaseException):
                self._finished = True
                raise message
            if message.get("type") == protocol.EVENT:
                yield str(message.get("event")), message.get("data") or {}
                continue
            self._finished = True
            assert self.request_id is not None
            self.result = self._client._finish(self.request_id, message)


class AsyncClient:
    def __init__(self, socket_path: str | os.PathLike[str] | None = None, *,
                 client_name: str = CLIENT_NAME, connect_timeout: float = 5.0,
                 autostart: bool | None = False) -> None:
        """`autostart`: start clusterd when nobody listens, as clusterctl does (None: unless
        CLUSTERD_NO_AUTOSTART is set); off by default for programs."""
        self.socket_path = os.fspath(socket_path) if socket_path else paths.socket_path()
        self._client_name = client_name
        self._connect_timeout = connect_timeout
        self._autostart = autostart
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None
        self._read_task: asyncio.Task[None] | None = None
        self._pending: dict[int, asyncio.Queue[dict[str, Any] | BaseException]] = {}
        self._next_id = 1
        self._write_lock = asyncio.Lock()
        self._lost: BaseException | None = None
        self.closed = asyncio.Event()
        self.server_hello: dict[str, Any] = {}

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.close()

    @property
    def connected(self) -> bool:
        return self._writer is not None and not self.closed.is_set()

    async def connect(self) -> None:
        # The blocking client's checks, as they are: the socket's directory is ours and
        # private, and the daemon runs as us; nothing is sent before both hold.
        opener = Client(self.socket_path, autostart=self._autostart,
                        connect_timeout=self._connect_timeout)
        raw = await asyncio.to_thread(opener.open_socket)
        # asyncio's transports want socket.socket, the blocking client uses the C type.
        sock = socket.socket(raw.family, raw.type, fileno=raw.detach())
        decoder = protocol.FrameDecoder()

        async def handshake() -> dict[str, Any]:
            self._reader, self._writer = await asyncio.open_unix_connection(
                sock=sock, limit=protocol.MAX_FRAME_BYTES + protocol.HEADER.size)
            await self._write(protocol.hello(self._client_name))
            return await self._read_frame(decoder)

        try:
            hello = await within(handshake(), self._connect_timeout)
        except (OSError, TimeoutError, asyncio.TimeoutError) as exc:
            await self.close()
            sock.close()  # if no writer took it over
            raise DaemonUnavailable(f"cannot reach clusterd at {self.socket_path}: {exc}",
                                    "start it with `clusterd`, or run `clusterctl status`"
                                    ) from None
        if hello.get("type") != protocol.HELLO:
            await self.close()
            if hello.get("type") == protocol.ERROR:
                raise ClusterdError.from_wire(hello.get("error"))
            raise ClusterdError(ErrorCode.BAD_FRAME, f"expected hello, got {hello.get('type')}")
        self.server_hello = hello
        self._read_task = asyncio.create_task(self._read_loop(decoder),
                                              name="clusterd-client-reader")

    async def close(self) -> None:
        task, self._read_task = self._read_task, None
        if task is not None:
            task.cancel()
            # asyncio.wait, not `await task` under suppress(CancelledError): that would also
            # swallow a cancellation of close()'s own caller, which would then run on.
            await asyncio.wait([task])
            if not task.cancelled():
                task.exception()  # retrieved: the reader's own failure was reported to callers
        writer, self._writer = self._writer, None
        if writer is not None:
            writer.close()
            # Bounded: a daemon that stopped reading must not hold up our own shutdown.
            with contextlib.suppress(OSError, TimeoutError, asyncio.TimeoutError):
                await within(writer.wait_closed(), CLOSE_TIMEOUT_S)
        self._fail_all(DaemonUnavailable("the connection to clusterd was closed"))

    # -- requests ---------------------------------------------------------------------------

    async def call(self, args: OpArgs) -> dict[str, Any]:
        """Send one request and return its result, skipping any events."""
        async with self.stream(args) as stream:
            async for _ in stream:
                pass
        assert stream.result is not None
        return stream.result

    def stream(self, args: OpArgs) -> AsyncStream:
        return AsyncStream(self, args)

    # -- internals --------------------------------------------------------------------------

    async def _submit(self, args: OpArgs
                      ) -> tuple[int, asyncio.Queue[dict[str, Any] | BaseException]]:
        if not self.connected:
            raise self._lost or DaemonUnavailable("not connected to clusterd")
        request_id = self._next_id
        self._next_id += 1
        queue: asyncio.Queue[dict[str, Any] | BaseException] = asyncio.Queue(QUEUE_FRAMES)
        self._pending[request_id] = queue
        try:
            await self._write(protocol.request(request_id, args.op, protocol.to_wire(args)))
        except OSError as exc:
            self._pending.pop(request_id, None)
            raise DaemonUnavailable(f"lost clusterd: {exc}") from None
        return request_id, queue

    async def _cancel(self, request_id: int) -> None:
        self._pending.pop(request_id, None)
        if self.connected:
            with contextlib.suppress(OSError):
                await self._write({"type": protocol.CANCEL, "id": request_id})

    def _finish(self, request_id: int, message: dict[str, Any]) -> dict[str, Any]:
        self._pending.pop(request_id, None)
        return result_of(message)

    async def _write(self, message: dict[str, Any]) -> None:
        assert self._writer is not None
        frame = protocol.encode_frame(message)
        async with self._write_lock:
            self._writer.write(frame)
            await self._writer.drain()

    async def _read_frame(self, decoder: protocol.FrameDecoder) -> dict[str, Any]:
        assert self._reader is not None
        while (message := decoder.next_message()) is None:
            chunk = await self._reader.read(RECEIVE_BYTES)
            if not chunk:
                raise ConnectionResetError("clusterd closed the connection")
            decoder.feed(chunk)
        return message

    async def _read_loop(self, decoder: protocol.FrameDecoder) -> None:
        try:
            while True:
                message = await self._read_frame(decoder)
                if message.get("type") == protocol.ERROR:
                    raise ClusterdError.from_wire(message.get("error"))
                queue = self._pending.get(message.get("id"))  # type: ignore[arg-type]
                if queue is not None:
                    await queue.put(message)
        except (OSError, protocol.ProtocolError) as exc:
            self._lost = DaemonUnavailable(f"lost the connection to clusterd: {exc}",
                                           "is clusterd running? `clusterctl status` starts it")
        except ClusterdError as exc:
            self._lost = exc
        finally:
            self.closed.set()
            self._fail_all(self._lost or DaemonUnavailable("the connection to clusterd closed"))

    def _fail_all(self, error: BaseException) -> None:
        self.closed.set()
        pending, self._pending = self._pending, {}
        for queue in pending.values():
            if queue.full():  # the stream is dead: its last frames matter less than why
                queue.get_nowait()
            queue.put_nowait(error)
