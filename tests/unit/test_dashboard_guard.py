"""The dashboard's guard over real HTTP: the dashboard's own application and server on
127.0.0.1 (its daemon link leads nowhere: everything checked here is answered before any
daemon call), sent requests written byte by byte, so hostile forms arrive as sent."""

from __future__ import annotations

import logging
import re
import urllib.parse
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from aiohttp import web

from clusterctl.dashboard import _app
from clusterctl.dashboard._board import Dashboard
from clusterctl.dashboard._daemon import DaemonLink
from clusterctl.dashboard._security import Guard

pytestmark = pytest.mark.anyio


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case

    @property
    def cookie(self) -> str:
        """The cookie set, as a Cookie header sends it back."""
        return self.headers["set-cookie"].split(";", 1)[0]


@dataclass
class Served:
    port: int
    guard: Guard

    async def send(self, target: bytes, *headers: bytes, method: bytes = b"GET") -> Answer:
        """One request on a connection of its own, exactly as given (our Host unless one is
        given); the status and headers of the answer."""
        if not any(h.lower().startswith(b"host:") for h in headers):
            headers = (f"Host: 127.0.0.1:{self.port}".encode(), *headers)
        request = b"\r\n".join([method + b" " + target + b" HTTP/1.1", *headers,
                                b"Connection: close", b"", b""])
        with anyio.fail_after(10):
            async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
                await stream.send(request)
                received = b""
                while b"\r\n\r\n" not in received:
                    try:
                        received += await stream.receive()
                    except anyio.EndOfStream:
                        break
        head = received.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
        fields = (line.split(":", 1) for line in head[1:] if ":" in line)
        return Answer(int(head[0].split()[1]), {k.strip().lower(): v.strip() for k, v in fields})

    async def login_target(self, path: str = "/") -> bytes:
        """`path` with what lets a browser in, as the printed URL carries it."""
        joiner = "&" if "?" in path else "?"
        return f"{path}{joiner}token={self.guard.token}".encode()

    async def login(self) -> str:
        """The session cookie, got as a browser gets it."""
        answer = await self.send(await self.login_target())
        assert answer.status == 302, answer
        return answer.cookie


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    sock = _app.bind(0)
    port = int(sock.getsockname()[1])
    guard = Guard(port)
    board = Dashboard(DaemonLink(str(tmp_path / "no-daemon.sock"), autostart=False), guard)
    runner = _app.make_runner(board)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield Served(port, guard)
    finally:
        await runner.cleanup()


def no_tracebacks(caplog: pytest.LogCaptureFixture) -> None:
    logged = [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
    assert not logged, [r.getMessage() for r in logged]


# -- credentials that are not ASCII, or not well formed ------------------------------------------


async def test_a_credential_that_is_not_ascii_is_refused_without_a_traceback(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    cookie = served.guard.cookie_name.encode()
    for value in (b"%C3%A9", b"%FF", b"%00", b"%E2%80%8B" * 40, b"%ED%A0%80"):
        answer = await served.send(b"/?token=" + value)
        assert answer.status == 403, value
        assert "set-cookie" not in answer.headers
    for value in (b"\xc3\xa9", b"\xff", b"\xe2\x80\x8b" * 40, b'"\\xyz"', b"a b"):
        answer = await served.send(b"/", b"Cookie: " + cookie + b"=" + value)
        assert answer.status == 403, value
    no_tracebacks(caplog)
    # The refusals were the values': the real ones still let us in.
    assert (await served.send(b"/static/dashboard.js",
                              f"Cookie: {await served.login()}".encode())).status == 200


async def test_bytes_the_http_parser_refuses_get_400_and_no_traceback(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Raw bytes no browser sends (it encodes them) never reach the guard: aiohttp answers
    400 itself. Nor may they print a traceback in the dashboard's terminal."""
    cookie = served.guard.cookie_name.encode()
    for target, header in ((b"/?token=\xc3\xa9", b"X-A: b"), (b"/?token=\xff", b"X-A: b"),
                           (b"/", b"Cookie: " + cookie + b"=\x01"),
                           (b"/\t/evil.example", b"X-A: b")):
        assert (await served.send(target, header)).status == 400, (target, header)
    no_tracebacks(caplog)
# -- redirects go to the dashboard's own paths ---------------------------------------------------


def where_a_browser_goes(location: str, base: str) -> str:
    """The host a browser goes to on this Location, read as browsers read it (the WHATWG URL
    parser): C0 controls and spaces at either end dropped, tabs and newlines anywhere dropped,
    a backslash taken for a slash in an http URL."""
    cleaned = re.sub(r"[\t\n\r]", "", location.strip("".join(map(chr, range(33)))))
    cleaned = cleaned.replace("\\", "/")
    return urllib.parse.urlsplit(urllib.parse.urljoin(base, cleaned)).netloc


HOSTILE_PATHS = [
    "//evil.example/x", "///evil.example/x", "////evil.example", "/\\evil.example/x",
    "/\\\\evil.example", "/%2F%2Fevil.example/x", "/%2F/evil.example", "/%5C%5Cevil.example",
    "/%5C/evil.example", "/%09/evil.example", "/%0A/evil.example", "/%0D%0A/evil.example",
    "/%2F%09/evil.example", "/..//evil.example", "/.%2F/evil.example", "/%00//evil.example",
    "http://evil.example/x", "//evil.example:80@127.0.0.1/x", "/%E2%80%8B/evil.example",
    "//evil.example/x?after=1", "/clusters/%2F%2Fevil.example",
]


async def test_every_redirect_stays_on_the_dashboard(served: Served) -> None:
    base = f"http://127.0.0.1:{served.port}/"
    cookie = f"Cookie: {await served.login()}".encode()
    for path in HOSTILE_PATHS:
        # Logging in on that path, and a session's visit to a login URL: both redirect.
        for headers in ((), (cookie,)):
            answer = await served.send(await served.login_target(path), *headers)
            assert answer.status == 302, (path, headers, answer)
            location = answer.headers["location"]
            assert re.fullmatch(r"/(?![/\\])[!#-\[\]-~]*", location), (path, location)
            assert where_a_browser_goes(location, base) == f"127.0.0.1:{served.port}", (
                path, location)
            assert "token=" not in location


async def test_a_redirect_keeps_the_path_and_the_rest_of_the_query(served: Served) -> None:
    answer = await served.send(await served.login_target("/clusters/web-1?after=5&x=a%20b"))
    assert answer.status == 302
    assert answer.headers["location"] in ("/clusters/web-1?after=5&x=a+b",
                                          "/clusters/web-1?after=5&x=a%20b")
