"""A timeout (anyio's `fail_after`) around a call to the agent ends as a timeout.

grpc, once it has cancelled a call, raises a CancelledError of its own, without the message by
which anyio knows a cancellation as its scope's: bare, that escapes the `fail_after` as a
cancellation of whatever runs around it. A managed job's watch (a task group) ended so, with
neither status nor error. Here a real grpc server on loopback never answers."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import anyio
import grpc
import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.runtime.agent_client import closed_under_the_call

pytestmark = pytest.mark.anyio


@pytest.fixture
async def silent_server() -> AsyncIterator[str]:
    async def never_answers(request: bytes, context: grpc.aio.ServicerContext) -> bytes:
        await asyncio.sleep(60)
        return b""

    server = grpc.aio.server()
    server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(
        "test.Silent", {"Call": grpc.unary_unary_rpc_method_handler(never_answers)})])
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield f"127.0.0.1:{port}"
    finally:
        await server.stop(None)


async def test_a_bare_grpc_call_lets_a_foreign_cancellation_out(silent_server: str) -> None:
    """What the wrapper is for: without it, the timeout is not seen as one."""
    async with grpc.aio.insecure_channel(silent_server) as channel:
        call = channel.unary_unary("/test.Silent/Call")
        with pytest.raises(asyncio.CancelledError):
            with anyio.fail_after(0.3):
                await call(b"")


async def test_a_timeout_around_a_wrapped_call_is_a_timeout(silent_server: str) -> None:
    async with grpc.aio.insecure_channel(silent_server) as channel:
        call = channel.unary_unary("/test.Silent/Call")
        with pytest.raises(TimeoutError):
            with anyio.fail_after(0.3):
                async with closed_under_the_call("c"):
                    await call(b"")
        # And the task goes on: nothing of that cancellation is left pending.
        await anyio.sleep(0.05)


async def test_a_channel_closed_under_a_call_is_an_unreachable_agent(silent_server: str
                                                                     ) -> None:
    channel = grpc.aio.insecure_channel(silent_server)
    call = channel.unary_unary("/test.Silent/Call")
    async with anyio.create_task_group() as group:
        async def close_soon() -> None:
            await anyio.sleep(0.3)
            await channel.close()

        group.start_soon(close_soon)
        with pytest.raises(ProtocolError) as failure:
            async with closed_under_the_call("c"):
                await call(b"")
    assert failure.value.code == ErrorCode.AGENT_UNREACHABLE
