"""One client connection: framed msgpack in, framed msgpack out. Knows the protocol's frames and
nothing of clusters: each request is handed to `dispatch` in a task of its own, so a slow
stream never holds up a quick status call on the same connection.

Closing the connection (or a `cancel` frame) cancels only the client's view of a request:
work owned by the daemon (launches, jobs) goes on.
"""

from __future__ import annotations

import os
import socket
import struct
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import anyio.abc
import structlog

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, OpArgs, ProtocolError
from clusterd import log, packing
from clusterd.server.stream import BufferedSocketStream

logger = log.get("clusterd.connection")

HELLO_TIMEOUT_S = 10.0
# A connection with no request in flight and no frame for this long is closed (Settings).
IDLE_TIMEOUT_S = 600.0
RECEIVE_BYTES = 256 * 1024
MAX_IN_FLIGHT = 256
CLIENT_GONE = (anyio.BrokenResourceError, anyio.ClosedResourceError, ConnectionError)


class Call:
    """What a handler sees of its request: the means to stream events back."""

    def __init__(self, connection: Connection, request_id: int) -> None:
        self._connection = connection
        self.request_id = request_id

    async def emit(self, event: str, data: dict[str, Any]) -> None:
        await self._connection.send(protocol.event(self.request_id, event, data))


Dispatch = Callable[[Call, OpArgs], Awaitable[dict[str, Any]]]


def peer_uid(stream: anyio.abc.SocketStream) -> int | None:
    raw = stream.extra(anyio.abc.SocketAttribute.raw_socket, None)
    if raw is None or raw.family != socket.AF_UNIX:
        return None
    creds = raw.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    _pid, uid, _gid = struct.unpack("3i", creds)
    return int(uid)


class Connection:
    def __init__(self, stream: BufferedSocketStream, dispatch: Dispatch,
                 server_name: str, idle_timeout_s: float = IDLE_TIMEOUT_S, *,
                 notices: Callable[[], list[protocol.Notice]] = list) -> None:
        self._stream = stream
        self._notices = notices
        self._dispatch = dispatch
        self._server_name = server_name
        self._decoder = protocol.FrameDecoder(limits=protocol.REQUEST_LIMITS)
        self._in_flight: dict[int, anyio.CancelScope] = {}
        self._idle_timeout_s = idle_timeout_s
        self._last_activity = 0.0

    async def send(self, message: dict[str, Any]) -> None:
        frame = packing.encode_frame(message)
        try:
            await self._stream.send(frame)  # whole, so concurrent replies never interleave
        except TimeoutError:
            logger.info("client stopped reading; dropping it")
            raise anyio.BrokenResourceError from None

    async def serve(self) -> None:
        try:
            async with self._stream:
                if not await self._authorize() or not await self._handshake():
                    return
                async with anyio.create_task_group() as group:
                    try:
                        self._last_activity = anyio.current_time()
                        group.start_soon(self._close_when_idle, group.cancel_scope)
                        await self._read_loop(group)
                    finally:
                        # The client is gone: stop relaying to it (detach, never kill).
                        group.cancel_scope.cancel()
        except* CLIENT_GONE:
            pass
        except* Exception:
            # One broken connection must never take the listener (and the daemon) with it.
            logger.exception("connection failed")

    async def _close_when_idle(self, scope: anyio.CancelScope) -> None:
        """Close the connection once it has had no request in flight and sent no frame for
        the idle timeout: idle connections would otherwise hold the daemon's descriptors."""
        while True:
            remaining = self._last_activity + self._idle_timeout_s - anyio.current_time()
            if remaining > 0:
                await anyio.sleep(remaining)
                continue
            if self._in_flight:
                self._last_activity = anyio.current_time()
                continue
            logger.info("closing an idle connection", idle_s=self._idle_timeout_s)
            await self._fail(ProtocolError(
                ErrorCode.IDLE_TIMEOUT,
                f"no request for {self._idle_timeout_s:g} s; closing the connection",
                "connect again when you have something to ask"))
            scope.cancel()
            return

    async def _fail(self, error: ProtocolError) -> None:
        try:
            with anyio.fail_after(2):
                await self.send(protocol.connection_error(error))
        except (TimeoutError, *CLIENT_GONE):
            pass

    async def _authorize(self) -> bool:
        uid = peer_uid(self._stream)
        if uid is None:  # not a Unix socket: nobody can say who is there
            logger.warning("refused a client whose uid cannot be known")
            await self._fail(ProtocolError(
                ErrorCode.PERMISSION_DENIED, "clusterd serves only its own user over a Unix "
                "socket", "connect to clusterd's Unix socket"))
            return False
        if uid != os.getuid():
            logger.warning("refused a client of another user", peer_uid=uid)
            await self._fail(ProtocolError(
                ErrorCode.PERMISSION_DENIED,
                f"this clusterd belongs to uid {os.getuid()}; you are uid {uid}",
                "run your own clusterd (each user has one)",
            ))
            return False
        return True

    async def _receive(self) -> dict[str, Any] | None:
        """The next message, or None when the peer closed the connection."""
        while (message := self._decoder.next_message()) is None:
            try:
                chunk = await self._stream.receive(RECEIVE_BYTES)
            except anyio.EndOfStream:
                if self._decoder.buffered:
                    logger.info("client closed mid-frame", buffered=self._decoder.buffered)
                return None
            self._decoder.feed(chunk)
        return message

    async def _handshake(self) -> bool:
        try:
            with anyio.fail_after(HELLO_TIMEOUT_S):
                hello = await self._receive()
        except TimeoutError:
            await self._fail(ProtocolError(ErrorCode.HELLO_REQUIRED,
                                           "no hello within 10 s", "send hello first"))
            return False
        except ProtocolError as exc:
            await self._fail(exc)
            return False
        if hello is None:
            return False
        if hello.get("type") != protocol.HELLO:
            await self._fail(ProtocolError(
                ErrorCode.HELLO_REQUIRED, "the first frame must be a hello",
                "see docs/protocol.md",
            ))
            return False
        version = hello.get("protocol")
        if version != protocol.PROTOCOL_VERSION:
            await self._fail(ProtocolError(
                ErrorCode.UNSUPPORTED_VERSION,
                f"protocol version {protocol.shown(version, 40)} is not supported; this "
                "clusterd speaks "
                f"{protocol.PROTOCOL_VERSION}",
                "upgrade the client or the daemon so they match",
            ))
            return False
        await self.send({
            "type": protocol.HELLO,
            "protocol": protocol.PROTOCOL_VERSION,
            "server": self._server_name,
            "ops": sorted(protocol.OPS),
            "features": list(protocol.FEATURES),
            "max_frame_bytes": protocol.MAX_FRAME_BYTES,
            **self._hello_notices(),
        })
        return True

    def _hello_notices(self) -> dict[str, Any]:
        notices = self._notices()
        return {protocol.HELLO_NOTICES: [notice.text for notice in notices],
                protocol.HELLO_ALERTS: [notice.to_wire() for notice in notices]}

    async def _read_loop(self, group: anyio.abc.TaskGroup) -> None:
        while True:
            try:
                message = await self._receive()
            except ProtocolError as exc:  # the framing itself is broken: nothing to resync
                logger.info("closing connection", code=str(exc.code), reason=exc.message)
                await self._fail(exc)
                return
            if message is None:
                return
            self._last_activity = anyio.current_time()
            kind = message.get("type")
            if kind == protocol.REQUEST:
                await self._start_request(group, message)
            elif kind == protocol.CANCEL:
                request_id = message.get("id")
                if not isinstance(request_id, int) or isinstance(request_id, bool):
                    await self.send(protocol.connection_error(ProtocolError(
                        ErrorCode.INVALID_ARGUMENT, "a cancel needs the integer id of a "
                        f"request, got {protocol.shown(request_id, 40)}")))
                    continue
                scope = self._in_flight.get(request_id)
                if scope is not None:
                    scope.cancel()
            else:
                await self._reply_error(message.get("id"), ProtocolError(
                    ErrorCode.BAD_FRAME, f"unexpected message type {protocol.shown(kind, 40)}",
                    "send request or cancel frames after the hello",
                ))

    async def _reply_error(self, request_id: Any, error: ProtocolError) -> None:
        if isinstance(request_id, int) and not isinstance(request_id, bool):
            await self.send(protocol.reply_error(request_id, error))
        else:
            await self.send(protocol.connection_error(error))

    async def _start_request(self, group: anyio.abc.TaskGroup, message: dict[str, Any]) -> None:
        request_id = message.get("id")
        if not isinstance(request_id, int) or isinstance(request_id, bool):
            await self.send(protocol.connection_error(ProtocolError(
                ErrorCode.INVALID_ARGUMENT, "a request needs an integer id")))
            return
        if request_id in self._in_flight:
            await self._reply_error(request_id, ProtocolError(
                ErrorCode.DUPLICATE_REQUEST_ID, f"request id {request_id} is already in flight"))
            return
        if len(self._in_flight) >= MAX_IN_FLIGHT:
            await self._reply_error(request_id, ProtocolError(
                ErrorCode.INVALID_ARGUMENT, f"more than {MAX_IN_FLIGHT} requests in flight",
                "wait for replies before sending more"))
            return
        op = message.get("op")
        op_type = protocol.OPS.get(op) if isinstance(op, str) else None
        if op_type is None:
            await self._reply_error(request_id, ProtocolError(
                ErrorCode.UNKNOWN_OP, f"unknown op {protocol.shown(op, 40)}",
                f"known ops: {', '.join(sorted(protocol.OPS))}"))
            return
        try:
            args = protocol.parse_args(op_type, message.get("args"))
        except ProtocolError as exc:
            await self._reply_error(request_id, exc)
            return
        scope = anyio.CancelScope()
        self._in_flight[request_id] = scope
        group.start_soon(self._run, request_id, args, scope)

    async def _run(self, request_id: int, args: OpArgs, scope: anyio.CancelScope) -> None:
        structlog.contextvars.bind_contextvars(client_request=request_id, op=args.op)
        try:
            with scope:
                try:
                    result = await self._dispatch(Call(self, request_id), args)
                    reply = protocol.reply_ok(request_id, result)
                except CLIENT_GONE:
                    return
                except ProtocolError as exc:
                    reply = protocol.reply_error(request_id, exc)
                except Exception as exc:
                    logger.exception("handler crashed")
                    reply = protocol.reply_error(request_id, ProtocolError(
                        ErrorCode.INTERNAL, f"{args.op} failed: {exc}",
                        "this is a bug in clusterd; the daemon log has the traceback"))
                try:
                    await self.send(reply)
                except ProtocolError as exc:  # a result too big for one frame
                    await self.send(protocol.reply_error(request_id, exc))
            if scope.cancelled_caught:
                # The client asked to stop this stream; what it followed goes on.
                await self.send(protocol.reply_ok(request_id, {"detached": True}))
        except CLIENT_GONE:
            pass
        finally:
            self._in_flight.pop(request_id, None)
            self._last_activity = anyio.current_time()
