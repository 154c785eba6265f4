"""The daemon's hello carries notices (a budget past its warning), over a real socket pair;
clusterctl prints each on stderr before the command's own output."""

from __future__ import annotations

import socket
from typing import Any

import anyio
import anyio.abc
import pytest

from clusterctl import cli, protocol
from clusterd.server.connection import Connection
from clusterd.server.stream import BufferedSocketStream

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def no_dispatch(*args: Any) -> Any:
    raise AssertionError("no request is sent")


def hello_over(theirs: socket.socket) -> dict[str, Any]:
    theirs.sendall(protocol.encode_frame(protocol.hello("test")))
    decoder = protocol.FrameDecoder()
    while (message := decoder.next_message()) is None:
        decoder.feed(theirs.recv(65536))
    theirs.close()
    return message


async def test_the_hello_carries_the_daemons_notices() -> None:
    ours, theirs = socket.socketpair()
    stream = await BufferedSocketStream.taking_over(
        await anyio.abc.UNIXSocketStream.from_socket(ours))
    assert stream is not None
    notices = [protocol.Notice("the monthly budget: $90.00 of $100 spent", "warn", "budget"),
               protocol.Notice("the monthly budget: exceeded", "error", "budget")]
    connection = Connection(stream, no_dispatch, "clusterd/test", notices=lambda: notices)
    async with anyio.create_task_group() as group:
        group.start_soon(connection.serve)
        hello = await anyio.to_thread.run_sync(hello_over, theirs)
    assert hello["type"] == protocol.HELLO
    assert protocol.notices_of(hello) == [notice.text for notice in notices]
    assert protocol.alerts_of(hello) == notices
    assert protocol.notices_of({"type": "hello"}) == []  # an older daemon's
    assert protocol.alerts_of({"type": "hello"}) == []
    # A daemon from before `alerts`: its lines, as warnings.
    assert protocol.alerts_of({protocol.HELLO_NOTICES: ["a line"]}) == [protocol.Notice("a line")]


def test_every_command_prints_the_notices_on_stderr(
        monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    class Hello:
        server_hello = {protocol.HELLO_NOTICES: ["past 80% of the budget"]}

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            pass

        def __enter__(self) -> Hello:
            return self

        def __exit__(self, *args: Any) -> None:
            pass

    monkeypatch.setattr(cli, "Client", Hello)
    monkeypatch.setitem(cli.COMMANDS, "status", lambda client, args: 0)
    monkeypatch.setattr(cli, "_exit", lambda code: None)
    cli.main(["status"])
    assert capsys.readouterr().err == "clusterd: past 80% of the budget\n"
