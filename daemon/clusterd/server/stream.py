"""A client connection's bytes over an asyncio transport that stays registered for reading.

anyio's Unix socket stream waits for every read by registering the socket with the selector
and unregistering it once readable: two epoll_ctl calls a read, and asyncio builds a KeyError
naming the socket (its repr asks the kernel for both addresses) each time. With 64 clients
sending status requests that was a fifth of the daemon's time. Here the transport reads as
data comes and buffers it; past a bound it stops reading until the buffer is drained, so a
client that sends faster than the daemon parses still holds a bounded amount of memory.
"""

from __future__ import annotations

import asyncio
import socket
from collections import deque

import anyio
import anyio.abc
import anyio.lowlevel

# Reading pauses past this much unparsed input (the decoder takes 256 KiB at a time).
HIGH_WATER_BYTES = 1024 * 1024
# A client that reads nothing for this long while the daemon has a frame for it is gone.
SEND_TIMEOUT_S = 60.0


class _Buffering(asyncio.Protocol):
    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.chunks: deque[bytes] = deque()
        self.buffered = 0
        self.at_eof = False
        self.error: BaseException | None = None
        self._readable: asyncio.Future[None] | None = None  # one reader at a time
        self._drained = asyncio.Event()  # any number of writers wait for it
        self._drained.set()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        self.chunks.append(data)
        self.buffered += len(data)
        if self.buffered > HIGH_WATER_BYTES and self.transport is not None:
            self.transport.pause_reading()
        _wake(self._readable)

    def eof_received(self) -> bool:
        self.at_eof = True
        _wake(self._readable)
        return True  # keep the write side open: replies to what came before still go out

    def connection_lost(self, exc: Exception | None) -> None:
        self.at_eof = True
        self.error = exc
        _wake(self._readable)
        self._drained.set()

    def pause_writing(self) -> None:
        self._drained.clear()

    def resume_writing(self) -> None:
        self._drained.set()

    async def readable(self) -> None:
        self._readable = asyncio.get_running_loop().create_future()
        try:
            await self._readable
        finally:
            self._readable = None

    @property
    def write_paused(self) -> bool:
        return not self._drained.is_set()

    async def writable(self) -> None:
        while not self._drained.is_set():
            await self._drained.wait()


def _wake(waiter: asyncio.Future[None] | None) -> None:
    if waiter is not None and not waiter.done():
        waiter.set_result(None)


class BufferedSocketStream(anyio.abc.SocketStream):
    """The few operations a connection uses: receive, send, close, and the raw socket (for
    the peer's credentials)."""

    def __init__(self, sock: socket.socket, transport: asyncio.Transport,
                 protocol: _Buffering, send_timeout_s: float) -> None:
        self.send_timeout_s = send_timeout_s
        self._sock = sock
        self._transport = transport
        self._protocol = protocol
        self._closed = False

    @classmethod
    async def taking_over(cls, stream: anyio.abc.SocketStream, *,
                          send_timeout_s: float = SEND_TIMEOUT_S) -> BufferedSocketStream | None:
        """The same connection as `stream`, which is closed; None if the peer has closed it
        already, having sent nothing (a probe of whether the daemon listens): known before
        the first wait, so it is not counted against the connection limit a moment longer
        than it was with anyio's stream."""
        raw = stream.extra(anyio.abc.SocketAttribute.raw_socket)
        try:
            try:
                if raw.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b"":
                    return None
            except BlockingIOError:
                pass
            # The descriptor itself, not a copy: out of descriptors, a copy would fail, and
            # the client be dropped instead of waiting its turn in the backlog.
            sock = socket.socket(raw.family, raw.type, fileno=raw.detach())
        finally:
            await stream.aclose()  # of the detached socket object: closes nothing
        try:
            transport, protocol = await asyncio.get_running_loop().connect_accepted_socket(
                _Buffering, sock)
        except BaseException:
            sock.close()
            raise
        return cls(sock, transport, protocol, send_timeout_s)

    @property
    def _raw_socket(self) -> socket.socket:
        return self._sock

    async def receive(self, max_bytes: int = 65536) -> bytes:
        protocol = self._protocol
        if protocol.chunks:
            await anyio.lowlevel.checkpoint()  # as anyio's streams do: a cancellation point
        while not protocol.chunks:
            if self._closed:
                raise anyio.ClosedResourceError
            if protocol.error is not None:
                raise anyio.BrokenResourceError from protocol.error
            if protocol.at_eof:
                raise anyio.EndOfStream
            await protocol.readable()
        chunk = protocol.chunks.popleft()
        if len(chunk) > max_bytes:
            protocol.chunks.appendleft(chunk[max_bytes:])
            chunk = chunk[:max_bytes]
        protocol.buffered -= len(chunk)
        if protocol.buffered <= HIGH_WATER_BYTES and not self._transport.is_closing():
            self._transport.resume_reading()  # a no-op unless it was paused
        return chunk

    async def send(self, item: bytes) -> None:
        """Buffer `item` whole: the frames of concurrent senders never interleave, with no
        lock. Waits first while the transport holds more than its high-water mark (the
        client reads slower than we write); TimeoutError after `send_timeout_s` of that."""
        await anyio.lowlevel.checkpoint_if_cancelled()
        if self._protocol.write_paused:
            with anyio.fail_after(self.send_timeout_s):
                await self._protocol.writable()
        if self._closed:
            raise anyio.ClosedResourceError
        if self._protocol.error is not None or self._transport.is_closing():
            raise anyio.BrokenResourceError from self._protocol.error
        self._transport.write(item)

    async def send_eof(self) -> None:
        self._transport.write_eof()

    async def aclose(self) -> None:
        if not self._closed:
            self._closed = True
            self._transport.close()
        await anyio.lowlevel.checkpoint()
