"""The asyncio client never swallows its caller's cancellation: a task that loses one runs on
(the dashboard once ignored Ctrl-C so, when it came as a feed connected)."""

from __future__ import annotations

import asyncio

from clusterctl.aio import AsyncClient, within


def test_within_passes_a_cancellation_that_comes_as_the_awaited_thing_finishes() -> None:
    async def scenario() -> asyncio.Task[int]:
        finished: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        waiter = asyncio.create_task(within(finished, 30))
        await asyncio.sleep(0)  # the waiter now waits on `finished`
        finished.set_result(1)  # both in one turn of the loop, as a reply and Ctrl-C may be
        waiter.cancel()
        await asyncio.wait([waiter], timeout=5)
        return waiter

    waiter = asyncio.run(scenario())
    assert waiter.done() and waiter.cancelled()


def test_within_times_out() -> None:
    async def scenario() -> str:
        try:
            await within(asyncio.sleep(30), 0.05)
        except TimeoutError:
            return "timed out"
        return "finished"

    assert asyncio.run(scenario()) == "timed out"


def test_close_passes_its_callers_cancellation_while_the_reader_winds_down() -> None:
    async def scenario() -> asyncio.Task[None]:
        wound_down = asyncio.Event()

        async def reader() -> None:
            try:
                await asyncio.sleep(30)
            except asyncio.CancelledError:
                await asyncio.sleep(0.2)  # a reader that takes a moment to end
                wound_down.set()
                raise

        client = AsyncClient("/nonexistent/clusterd.sock")
        client._read_task = asyncio.create_task(reader())
        await asyncio.sleep(0)
        closing = asyncio.create_task(client.close())
        await asyncio.sleep(0.05)  # close() waits for the reader now
        closing.cancel()
        await asyncio.wait([closing], timeout=5)
        await asyncio.wait_for(wound_down.wait(), 5)
        assert client._read_task is None
        return closing

    closing = asyncio.run(scenario())
    assert closing.done() and closing.cancelled()
