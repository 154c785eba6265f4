"""Who may use the dashboard: the browser that opened a link it printed, and whoever holds its
token (its own user's processes), through the loopback address, from its own pages.

* A printed link carries a one-time code, not the token: good for one use, within
  CODE_LIFETIME_S. A browser's command line (any user reads it in /proc) and history then hold
  nothing that lets anyone in. The code is traded for an HttpOnly, SameSite=Strict cookie,
  and the browser is sent on to the same page without it. Every request, assets included,
  needs the cookie (or the token): else 403.
* The token stays in this process and in the state file only its user can read
  (`_instance.py`). It is taken only in an Authorization header: that is how a second
  `clusterctl dashboard` asks for a new link (POST /api/login-code), and how scripts get in.
* The Host header must name the loopback address and this port (127.0.0.1:PORT or
  localhost:PORT): a DNS-rebinding page's requests carry its own host name, and are refused.
* Requests that change something (any method but GET and HEAD) and WebSocket upgrades must
  carry an Origin of this very server, unless they carry the token (no browser adds that
  header on its own, as it adds cookies).
* On Linux, a connection from another local user's process is refused whatever it carries
  (a cookie can leak: browsers send it to every port of 127.0.0.1): the kernel's table of TCP
  sockets names the owner of the peer's end, as SO_PEERCRED does for the daemon's socket.
* Redirects go only to this dashboard's own paths; values that are not ASCII are refused
  (403), never compared.
* Every answer forbids framing, sniffing, caching and referrers, and allows scripts, styles
  and connections to this origin only.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import socket
import time
from collections.abc import Awaitable, Callable
from urllib.parse import urlencode

from aiohttp import hdrs, web

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
SAFE_METHODS = frozenset({"GET", "HEAD"})
HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
        "connect-src 'self'; form-action 'self'; base-uri 'none'; frame-ancestors 'none'"),
    "X-Content-Type-Options": "nosniff",
    "X-Frame-Options": "DENY",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# A path a Location may hold: one slash first, and then nothing but what a path is made of
# (RFC 3986; percent-encoded, ASCII). "//host" is another host to a browser, and so are
# "/\host" and "/<tab>/host" (it reads a backslash as "/" and drops tabs and newlines).
OWN_PATH = re.compile(r"/(?![/\\])[-A-Za-z0-9._~%!$&'()*+,;=:@/]*")

# A login link's code: good for one use, within seconds (time to open a browser, or to copy
# the link into one), and few wait at a time (each second `clusterctl dashboard` adds one).
CODE_LIFETIME_S = 30.0
CODES_KEPT = 16

TCP_TABLE = "/proc/net/tcp"


def _hex_address(address: tuple[str, int]) -> str:
    """An IPv4 address as /proc/net/tcp writes it: the address in host byte order, then the
    port, in hex."""
    packed = socket.inet_aton(address[0])
    return f"{int.from_bytes(packed, 'little'):08X}:{address[1]:04X}"


def peer_uid(peer: tuple[str, int], local: tuple[str, int]) -> int | None:
    """The uid owning the other end of the TCP connection peer → local on this machine, or
    None where the kernel does not say (no /proc, or no such socket)."""
    want = (_hex_address(peer), _hex_address(local))
    try:
        with open(TCP_TABLE) as table:
            next(table, None)
            for line in table:
                fields = line.split()
                if len(fields) > 7 and (fields[1], fields[2]) == want:
                    return int(fields[7])
    except OSError:
        return None
    return None


def same_secret(given: str, secret: str) -> bool:
    """Whether a value a request carries is `secret`, in constant time. A value that is not
    ASCII (a percent-encoded or raw UTF-8 byte, say) is no secret of ours, and would make
    hmac.compare_digest raise."""
    return given.isascii() and hmac.compare_digest(given, secret)


class OneTimeCodes:
    """What a URL carries instead of the token: a code that is good for one use, and for
    `lifetime_s` only. A browser's command line (readable by any user in /proc) and its
    history then hold nothing that lets anyone in. At most `kept` codes wait to be used;
    a new one pushes out the oldest."""

    def __init__(self, lifetime_s: float = CODE_LIFETIME_S, kept: int = CODES_KEPT,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.lifetime_s = lifetime_s
        self.kept = kept
        self._clock = clock
        self._expiry: dict[str, float] = {}  # code -> when it expires; oldest first

    def new(self) -> str:
        self._forget_expired()
        while len(self._expiry) >= self.kept:
            del self._expiry[next(iter(self._expiry))]
        code = secrets.token_urlsafe(16)
        self._expiry[code] = self._clock() + self.lifetime_s
        return code

    def use(self, given: str) -> bool:
        """Whether `given` is a code still good; either way, it is good no more. No await in
        here: of requests that carry one code at once, one gets True."""
        self._forget_expired()
        # Compared with each code, to the end: how long this takes says nothing of them.
        found = [code for code in list(self._expiry) if same_secret(given, code)]
        for code in found:
            del self._expiry[code]
        return bool(found)

    def _forget_expired(self) -> None:
        now = self._clock()
        for code in [c for c, expiry in self._expiry.items() if expiry <= now]:
            del self._expiry[code]


class Guard:
    """The dashboard's middleware (every request passes it first), its login links, and the
    headers of every answer."""

    def __init__(self, port: int, token: str | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.port = port
        # Kept by this process, and in the state file only its user may read; sent only in
        # an Authorization header (see `new_code_handler`), never in a URL.
        self.token = token or secrets.token_urlsafe(32)
        # What the cookie holds: not the token itself, so the token is not sent on every
        # request (nor kept by the browser), and cookies of other dashboards on other ports
        # of this host (cookies ignore ports) are told apart by name.
        self._session = secrets.token_urlsafe(32)
        self._codes = OneTimeCodes(clock=clock)
        self.cookie_name = f"clusterd_dashboard_{port}"
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})

    @property
    def code_lifetime_s(self) -> float:
        return self._codes.lifetime_s

    @property
    def codes_kept(self) -> int:
        return self._codes.kept

    def new_code(self) -> str:
        return self._codes.new()

    def login_url(self) -> str:
        """A URL that lets one browser in, once, for the next `code_lifetime_s`."""
        return f"http://127.0.0.1:{self.port}/?code={self.new_code()}"

    def _forbidden(self, why: str) -> web.Response:
        return web.Response(status=403, text=f"403 Forbidden: {why}\n", headers=HEADERS)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._own_user(request):
            return self._forbidden("this dashboard belongs to another user")
        host = request.headers.get(hdrs.HOST, "")
        if host not in self.hosts:
            return self._forbidden("this dashboard answers only to 127.0.0.1 on its own port")
        if hdrs.AUTHORIZATION in request.headers:
            # A script's, or a second `clusterctl dashboard`'s. It needs no Origin: a
            # browser adds this header to no request on its own, as it does cookies.
            if not self._holds_token(request):
                return self._forbidden("a wrong token")
            return await handler(request)
        upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        if request.method not in SAFE_METHODS or upgrade:
            origin = request.headers.get(hdrs.ORIGIN, "")
            if origin not in {f"http://{h}" for h in self.hosts}:
                return self._forbidden("a request from another origin")
        cookie = request.cookies.get(self.cookie_name, "")
        session = bool(cookie) and same_secret(cookie, self._session)
        code = request.query.get("code")
        if code is not None and request.method == "GET":  # as a browser opens a link
            # Used up even by a browser that has a session: each code lets in once.
            if self._codes.use(code):
                redirect = self._clean(request)
                redirect.set_cookie(self.cookie_name, self._session, httponly=True,
                                    samesite="Strict", path="/")
                raise redirect
            if session:  # the link again (a reload, the history): drop it from the bar
                raise self._clean(request)
            return self._forbidden(
                "this link was used already, or is too old: run `clusterctl dashboard` "
                "for a new one (each lets one browser in, once, within "
                f"{self.code_lifetime_s:g} s)")
        if session:
            return await handler(request)
        return self._forbidden(
            "open the link that `clusterctl dashboard` prints (run it again for a new one)")

    async def new_code_handler(self, request: web.Request) -> web.Response:
        """POST, with the token in the Authorization header: a new login URL, for a second
        `clusterctl dashboard` to open. A page's session gets none."""
        if not self._holds_token(request):
            return self._forbidden("only with the token (Authorization: Bearer ...)")
        return web.json_response({"url": self.login_url(),
                                  "expires_in_s": self.code_lifetime_s})

    async def headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every answer's headers (streams too: this runs as each one is prepared)."""
        response.headers.update(HEADERS)

    def _holds_token(self, request: web.Request) -> bool:
        scheme, _, value = request.headers.get(hdrs.AUTHORIZATION, "").partition(" ")
        return scheme.lower() == "bearer" and same_secret(value.strip(), self.token)

    def _own_user(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None or not os.path.exists(TCP_TABLE):
            return transport is not None  # not Linux: the token and cookie must do
        peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        if not peer or not local:
            return False
        return peer_uid(peer[:2], local[:2]) == os.getuid()

    def _clean(self, request: web.Request) -> web.HTTPFound:
        """A redirect to the same page without the code in its address."""
        return web.HTTPFound(own_location(request, drop="code"), headers=HEADERS)


def own_location(request: web.Request, drop: str) -> str:
    """Where to send the browser next: the request's own path and query, less `drop`; its
    path only if no browser could read it as another host's (else the front page)."""
    path = request.rel_url.raw_path  # as sent: decoding "%2F" would make a slash of it
    if not OWN_PATH.fullmatch(path):
        path = "/"
    query = [(k, v) for k, v in request.query.items() if k != drop]
    return f"{path}?{urlencode(query)}" if query else path
