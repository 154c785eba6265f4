"""The daemon's client stream (clusterd.server.stream) over real socket pairs: frames of
concurrent senders stay whole, a client that reads nothing is dropped after the send timeout,
one that writes without end holds bounded memory, and a probe that closed before it was served
is told apart at once."""

from __future__ import annotations

import os
import resource
import socket
import threading
import time
from collections.abc import AsyncIterator

import anyio
import anyio.abc
import pytest

from clusterd.server.stream import HIGH_WATER_BYTES, BufferedSocketStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def taken(sock: socket.socket, send_timeout_s: float = 5.0) -> BufferedSocketStream:
    stream = await anyio.abc.UNIXSocketStream.from_socket(sock)
    buffered = await BufferedSocketStream.taking_over(stream, send_timeout_s=send_timeout_s)
    assert buffered is not None
    return buffered


@pytest.fixture
async def pair() -> AsyncIterator[tuple[BufferedSocketStream, socket.socket]]:
    ours, theirs = socket.socketpair()
    stream = await taken(ours, send_timeout_s=0.5)
    try:
        yield stream, theirs
    finally:
        await stream.aclose()
        theirs.close()


def read_all(sock: socket.socket, into: bytearray) -> None:
    while chunk := sock.recv(1 << 20):
        into += chunk


async def test_frames_of_concurrent_senders_stay_whole(
        pair: tuple[BufferedSocketStream, socket.socket]) -> None:
    stream, theirs = pair
    received = bytearray()
    reader = threading.Thread(target=read_all, args=(theirs, received))
    reader.start()
    frames = {name: bytes([name]) * 300_000 for name in range(8)}  # past the high-water mark

    async def send(name: int) -> None:
        for _ in range(5):
            await stream.send(frames[name])

    async with anyio.create_task_group() as group:
        for name in frames:
            group.start_soon(send, name)
    await stream.aclose()
    await anyio.to_thread.run_sync(reader.join, 10)
    assert len(received) == 8 * 5 * 300_000
    for start in range(0, len(received), 300_000):
        frame = received[start:start + 300_000]
        assert frame == frames[frame[0]], f"a frame interleaved at byte {start}"


async def test_a_client_that_reads_nothing_is_timed_out(
        pair: tuple[BufferedSocketStream, socket.socket]) -> None:
    stream, _theirs = pair
    started = time.monotonic()
    with pytest.raises(TimeoutError):
        for _ in range(1000):
            await stream.send(b"x" * 65536)
    assert 0.4 < time.monotonic() - started < 5


async def test_a_client_that_writes_without_end_holds_bounded_memory(
        pair: tuple[BufferedSocketStream, socket.socket]) -> None:
    stream, theirs = pair
    theirs.settimeout(0.5)
    sent = 0

    def flood() -> None:
        nonlocal sent
        try:
            while sent < 64 * HIGH_WATER_BYTES:
                sent += theirs.send(b"y" * 65536)
        except TimeoutError:  # the daemon stopped reading: the kernel's buffers are full
            pass

    await anyio.to_thread.run_sync(flood)
    assert sent < 8 * HIGH_WATER_BYTES, "reading never paused"
    received = 0
    theirs.settimeout(None)
    thread = threading.Thread(target=lambda: theirs.sendall(b"z" * HIGH_WATER_BYTES))
    thread.start()
    with anyio.fail_after(10):  # and it resumes once drained
        while received < sent + HIGH_WATER_BYTES:
            received += len(await stream.receive(256 * 1024))
    await anyio.to_thread.run_sync(thread.join, 10)


async def test_eof_comes_after_the_data_before_it(
        pair: tuple[BufferedSocketStream, socket.socket]) -> None:
    stream, theirs = pair
    theirs.sendall(b"hello")
    theirs.shutdown(socket.SHUT_WR)
    assert await stream.receive() == b"hello"
    with pytest.raises(anyio.EndOfStream):
        await stream.receive()
    await stream.send(b"still open for replies")
    assert theirs.recv(100) == b"still open for replies"


async def test_a_probe_closed_before_it_was_served_is_none() -> None:
    ours, theirs = socket.socketpair()
    theirs.close()
    stream = await anyio.abc.UNIXSocketStream.from_socket(ours)
    assert await BufferedSocketStream.taking_over(stream) is None
    assert ours.fileno() == -1  # closed with it


async def test_taking_over_needs_no_descriptor_of_its_own() -> None:
    """Out of descriptors (accept itself just took the last), the connection is still
    served: a copy of its descriptor would fail, and the client be dropped."""
    ours, theirs = socket.socketpair()
    stream = await anyio.abc.UNIXSocketStream.from_socket(ours)
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    highest = max(int(fd) for fd in os.listdir("/proc/self/fd"))
    fillers: list[int] = []
    resource.setrlimit(resource.RLIMIT_NOFILE, (highest + 1, hard))
    try:
        with pytest.raises(OSError):
            while True:  # take every descriptor left under the limit
                fillers.append(os.dup(theirs.fileno()))
        buffered = await BufferedSocketStream.taking_over(stream)
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert buffered is not None
    try:
        theirs.sendall(b"ping")
        assert await buffered.receive() == b"ping"
    finally:
        await buffered.aclose()
        theirs.close()
