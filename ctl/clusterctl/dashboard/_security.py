"""Who may use the dashboard: whoever holds the token of the URL it printed, through the
loopback address, from its own pages.

* The token (random, in the printed URL) is traded on first use for an HttpOnly,
  SameSite=Strict cookie, and the browser is sent on to the same page without it. Every
  request, assets included, needs the cookie or the token: else 403.
* The Host header must name the loopback address and this port (127.0.0.1:PORT or
  localhost:PORT): a DNS-rebinding page's requests carry its own host name, and are refused.
* Requests that change something (any method but GET and HEAD) and WebSocket upgrades must
  carry an Origin of this very server.
* On Linux, a connection from another local user's process is refused whatever it carries
  (a cookie can leak: browsers send it to every port of 127.0.0.1): the kernel's table of TCP
  sockets names the owner of the peer's end, as SO_PEERCRED does for the daemon's socket.
* Every answer forbids framing, sniffing, caching and referrers, and allows scripts, styles
  and connections to this origin only.
"""

from __future__ import annotations

import hmac
import os
import re
import secrets
import socket
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


class Guard:
    def __init__(self, port: int, token: str | None = None) -> None:
        self.port = port
        self.token = token or secrets.token_urlsafe(32)
        # What the cookie holds: not the token itself, so the token is not sent on every
        # request (nor kept by the browser), and cookies of other dashboards on other ports
        # of this host (cookies ignore ports) are told apart by name.
        self._session = secrets.token_urlsafe(32)
        self.cookie_name = f"clusterd_dashboard_{port}"
        self.hosts = frozenset({f"127.0.0.1:{port}", f"localhost:{port}"})

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}/?token={self.token}"

    def _forbidden(self, why: str) -> web.Response:
        return web.Response(status=403, text=f"403 Forbidden: {why}\n", headers=HEADERS)

    @web.middleware
    async def middleware(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self._own_user(request):
            return self._forbidden("this dashboard belongs to another user")
        host = request.headers.get(hdrs.HOST, "")
        if host not in self.hosts:
            return self._forbidden("this dashboard answers only to 127.0.0.1 on its own port")
        upgrade = request.headers.get(hdrs.UPGRADE, "").lower() == "websocket"
        if request.method not in SAFE_METHODS or upgrade:
            origin = request.headers.get(hdrs.ORIGIN, "")
            if origin not in {f"http://{h}" for h in self.hosts}:
                return self._forbidden("a request from another origin")
        cookie = request.cookies.get(self.cookie_name, "")
        token = request.query.get("token", "")
        if cookie and same_secret(cookie, self._session):
            if token:  # a bookmarked URL with the token: drop it from the address bar
                raise self._without_token(request)
            return await handler(request)
        if token and same_secret(token, self.token) and request.method in SAFE_METHODS:
            redirect = self._without_token(request)
            redirect.set_cookie(self.cookie_name, self._session, httponly=True,
                                samesite="Strict", path="/")
            raise redirect
        return self._forbidden(
            "open the URL that `clusterctl dashboard` printed (it carries the token)")

    async def headers(self, request: web.Request, response: web.StreamResponse) -> None:
        """Every answer's headers (streams too: this runs as each one is prepared)."""
        response.headers.update(HEADERS)

    def _own_user(self, request: web.Request) -> bool:
        transport = request.transport
        if transport is None or not os.path.exists(TCP_TABLE):
            return transport is not None  # not Linux: the token and cookie must do
        peer, local = transport.get_extra_info("peername"), transport.get_extra_info("sockname")
        if not peer or not local:
            return False
        return peer_uid(peer[:2], local[:2]) == os.getuid()

    def _without_token(self, request: web.Request) -> web.HTTPFound:
        return web.HTTPFound(own_location(request, drop="token"), headers=HEADERS)


def own_location(request: web.Request, drop: str) -> str:
    """Where to send the browser next: the request's own path and query, less `drop`; its
    path only if no browser could read it as another host's (else the front page)."""
    path = request.rel_url.raw_path  # as sent: decoding "%2F" would make a slash of it
    if not OWN_PATH.fullmatch(path):
        path = "/"
    query = [(k, v) for k, v in request.query.items() if k != drop]
    return f"{path}?{urlencode(query)}" if query else path
