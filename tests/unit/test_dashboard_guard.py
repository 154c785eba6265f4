"""The dashboard's guard over real HTTP: the dashboard's own application and server on
127.0.0.1 (its daemon link leads nowhere: everything checked here is answered before any
daemon call), sent requests written byte by byte, so hostile forms arrive as sent."""

from __future__ import annotations

import json
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
from clusterctl.dashboard._instance import Instance
from clusterctl.dashboard._security import Guard

pytestmark = pytest.mark.anyio


@dataclass
class Answer:
    status: int
    headers: dict[str, str]  # names in lower case
    text: str

    @property
    def cookie(self) -> str:
        """The cookie set, as a Cookie header sends it back."""
        return self.headers["set-cookie"].split(";", 1)[0]


class Clock:
    """The guard's clock, moved on by the test: a code's age without waiting for it."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@dataclass
class Served:
    port: int
    guard: Guard
    clock: Clock

    async def send(self, target: bytes, *headers: bytes, method: bytes = b"GET") -> Answer:
        """One request on a connection of its own, exactly as given (our Host unless one is
        given; a POST with an empty JSON body); the status, headers and body of the answer."""
        if not any(h.lower().startswith(b"host:") for h in headers):
            headers = (f"Host: 127.0.0.1:{self.port}".encode(), *headers)
        body = b"{}" if method == b"POST" else b""
        if body:
            headers = (*headers, b"Content-Type: application/json", b"Content-Length: 2")
        request = b"\r\n".join([method + b" " + target + b" HTTP/1.1", *headers,
                                b"Connection: close", b"", body])
        with anyio.fail_after(10):
            async with await anyio.connect_tcp("127.0.0.1", self.port) as stream:
                await stream.send(request)
                received = b""
                while True:
                    try:
                        received += await stream.receive()
                    except anyio.EndOfStream:
                        break
        head, _, text = received.partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        fields = (line.split(":", 1) for line in lines[1:] if ":" in line)
        return Answer(int(lines[0].split()[1]),
                      {k.strip().lower(): v.strip() for k, v in fields}, text.decode())

    async def login_target(self, path: str = "/") -> bytes:
        """`path` with what lets a browser in, as the printed URL carries it."""
        joiner = "&" if "?" in path else "?"
        return f"{path}{joiner}code={self.guard.new_code()}".encode()

    def bearer(self, token: str | None = None) -> bytes:
        return f"Authorization: Bearer {token or self.guard.token}".encode()

    def origin(self) -> bytes:
        return f"Origin: http://127.0.0.1:{self.port}".encode()

    async def login(self) -> str:
        """The session cookie, got as a browser gets it."""
        answer = await self.send(await self.login_target())
        assert answer.status == 302, answer
        return answer.cookie


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    sock = _app.bind(0)
    port = int(sock.getsockname()[1])
    clock = Clock()
    guard = Guard(port, clock=clock)
    board = Dashboard(DaemonLink(str(tmp_path / "no-daemon.sock"), autostart=False), guard)
    runner = _app.make_runner(board)
    await runner.setup()
    try:
        await web.SockSite(runner, sock).start()
        yield Served(port, guard, clock)
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
        for name in (b"token", b"code"):
            answer = await served.send(b"/?" + name + b"=" + value)
            assert answer.status == 403, value
            assert "set-cookie" not in answer.headers
    for value in (b"\xc3\xa9", b"\xff", b"\xe2\x80\x8b" * 40, b'"\\xyz"', b"a b"):
        answer = await served.send(b"/", b"Cookie: " + cookie + b"=" + value)
        assert answer.status == 403, value
        for authorization in (b"Bearer " + value, value, b"Basic " + value):
            answer = await served.send(b"/api/login-code", b"Authorization: " + authorization,
                                       served.origin(), method=b"POST")
            assert answer.status == 403, authorization
    no_tracebacks(caplog)
    # The refusals were the values': the real ones still let us in.
    assert (await served.send(b"/static/dashboard.js",
                              f"Cookie: {await served.login()}".encode())).status == 200


async def test_bytes_the_http_parser_refuses_get_400_and_no_traceback(
        served: Served, caplog: pytest.LogCaptureFixture) -> None:
    """Raw bytes no browser sends (it encodes them) never reach the guard: aiohttp answers
    400 itself. Nor may they print a traceback in the dashboard's terminal."""
    cookie = served.guard.cookie_name.encode()
    for target, header in ((b"/?code=\xc3\xa9", b"X-A: b"), (b"/?code=\xff", b"X-A: b"),
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
            assert "code=" not in location


async def test_a_redirect_keeps_the_path_and_the_rest_of_the_query(served: Served) -> None:
    answer = await served.send(await served.login_target("/clusters/web-1?after=5&x=a%20b"))
    assert answer.status == 302
    assert answer.headers["location"] in ("/clusters/web-1?after=5&x=a+b",
                                          "/clusters/web-1?after=5&x=a%20b")


# -- one-time codes: what a URL carries instead of the token ------------------------------------


def code_of(url: str) -> str:
    match = re.fullmatch(r"http://127\.0\.0\.1:\d+/\?code=([A-Za-z0-9_-]{16,})", url)
    assert match, url
    return match.group(1)


async def test_the_url_holds_a_code_that_lets_in_once(served: Served) -> None:
    url = served.guard.login_url()
    assert served.guard.token not in url
    code = code_of(url)
    first = await served.send(f"/?code={code}".encode())
    assert first.status == 302 and first.headers["location"] == "/"
    assert "HttpOnly" in first.headers["set-cookie"]
    assert "SameSite=Strict" in first.headers["set-cookie"]
    cookie = f"Cookie: {first.cookie}".encode()
    assert (await served.send(b"/static/dashboard.js", cookie)).status == 200
    again = await served.send(f"/?code={code}".encode())
    assert again.status == 403 and "set-cookie" not in again.headers
    assert "clusterctl dashboard" in again.text  # how to get another
    # The session that used it, back on the same link (a reload, history): sent on, clean.
    back = await served.send(f"/events?code={code}".encode(), cookie)
    assert back.status == 302 and back.headers["location"] == "/events"


async def test_a_code_is_good_for_its_lifetime_only(served: Served) -> None:
    lifetime = served.guard.code_lifetime_s
    assert 0 < lifetime <= 30
    early, late = served.guard.new_code(), served.guard.new_code()
    served.clock.now += lifetime - 0.01
    assert (await served.send(f"/?code={early}".encode())).status == 302
    served.clock.now += 0.02
    assert (await served.send(f"/?code={late}".encode())).status == 403


async def test_a_code_used_at_once_by_many_lets_one_in(served: Served) -> None:
    code = served.guard.new_code()
    statuses: list[int] = []

    async def use() -> None:
        statuses.append((await served.send(f"/?code={code}".encode())).status)

    async with anyio.create_task_group() as group:
        for _ in range(20):
            group.start_soon(use)
    assert sorted(statuses) == [302] + [403] * 19


async def test_the_codes_kept_are_few_the_oldest_go_first(served: Served) -> None:
    codes = [served.guard.new_code() for _ in range(1000)]
    assert len(set(codes)) == len(codes)
    kept = served.guard.codes_kept
    assert 0 < kept <= 100
    assert (await served.send(f"/?code={codes[-kept - 1]}".encode())).status == 403
    assert (await served.send(f"/?code={codes[-kept]}".encode())).status == 302


async def test_the_token_is_no_url_parameter(served: Served) -> None:
    for target in (f"/?token={served.guard.token}", f"/?code={served.guard.token}"):
        answer = await served.send(target.encode())
        assert answer.status == 403 and "set-cookie" not in answer.headers, target


async def test_the_token_holder_gets_new_codes(served: Served) -> None:
    """How a second `clusterctl dashboard` gets a link to open: it holds the token (from the
    private state file) and asks, in a header."""
    answer = await served.send(b"/api/login-code", served.bearer(), method=b"POST")
    assert answer.status == 200, answer
    reply = json.loads(answer.text)
    assert reply["expires_in_s"] == served.guard.code_lifetime_s
    code = code_of(reply["url"])
    assert served.guard.token not in answer.text
    assert (await served.send(f"/?code={code}".encode())).status == 302

    # Not for a session (a page's script), nor a wrong token, nor as a GET.
    cookie = f"Cookie: {await served.login()}".encode()
    for headers in ((), (cookie, served.origin()),
                    (served.bearer("x" * len(served.guard.token)), served.origin())):
        answer = await served.send(b"/api/login-code", *headers, method=b"POST")
        assert answer.status == 403, headers
    assert (await served.send(b"/api/login-code", served.bearer())).status in (403, 405)


async def test_scripts_get_in_with_the_token_in_a_header(served: Served) -> None:
    answer = await served.send(b"/static/dashboard.js", served.bearer())
    assert answer.status == 200 and "set-cookie" not in answer.headers
    # A foreign Host is refused all the same (the token does not excuse DNS rebinding).
    foreign = await served.send(b"/static/dashboard.js", served.bearer(),
                                b"Host: evil.example")
    assert foreign.status == 403


async def test_a_second_dashboard_gets_a_link_with_the_state_file(served: Served,
                                                                  tmp_path: Path) -> None:
    running = Instance(str(tmp_path / "rt"))
    assert running.acquire()
    try:
        running.publish(served.port, served.guard.token)
        second = Instance(str(tmp_path / "rt"))
        state = second.read()
        assert state is not None
        link = await anyio.to_thread.run_sync(second.login_link, state)
        assert link is not None
        url, lifetime_s = link
        assert lifetime_s == served.guard.code_lifetime_s
        assert (await served.send(f"/?code={code_of(url)}".encode())).status == 302
        wrong = {**state, "token": "x" * len(served.guard.token)}
        assert await anyio.to_thread.run_sync(second.login_link, wrong) is None
    finally:
        running.release()
