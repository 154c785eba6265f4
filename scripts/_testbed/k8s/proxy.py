"""The API endpoint clusterd's contexts use (https://127.0.0.1:6443 in the bed's namespace): a
TLS proxy in front of the API server (127.0.0.1:6444) that forwards every request unchanged -
the client's own token included, so the API server sees the client's user - except where a
fault rule says otherwise (faults.py).

It reads HTTP/1.1 just enough to see each request of a kept-alive connection and relay its
answer as it comes: bodies by Content-Length or chunks (watches and `logs -f` stream), and an
upgrade (exec, attach, port-forward: SPDY or WebSocket) spliced both ways after the 101. It
offers only http/1.1 by ALPN, so Go clients do not speak HTTP/2 to it. One thread per client
connection. Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import logging
import select
import socket
import ssl
import threading
from typing import Any

from _testbed.k8s.faults import Request, Rule, body_name, make_rule, pick_rule, request_info
from _testbed.k8s.faults import status_body as fault_status

log = logging.getLogger("testbed.k8s.proxy")

MAX_HEAD = 64 * 1024
CHUNK = 64 * 1024
UPSTREAM_TIMEOUT_S = 30.0


class Closed(Exception):
    """The peer closed the connection (or sent something we cannot read)."""


class Stream:
    """A socket with an explicit read buffer (so nothing read ahead is lost at an upgrade)."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buf = bytearray()

    def _fill(self) -> None:
        data = self.sock.recv(CHUNK)
        if not data:
            raise Closed()
        self.buf += data

    def read_head(self) -> bytes | None:
        """Up to and including the blank line; None if the peer closed before a byte."""
        while b"\r\n\r\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise Closed()
            try:
                self._fill()
            except Closed:
                if self.buf:
                    raise
                return None
        end = self.buf.index(b"\r\n\r\n") + 4
        head = bytes(self.buf[:end])
        del self.buf[:end]
        return head

    def readline(self) -> bytes:
        while b"\n" not in self.buf:
            if len(self.buf) > MAX_HEAD:
                raise Closed()
            self._fill()
        end = self.buf.index(b"\n") + 1
        line = bytes(self.buf[:end])
        del self.buf[:end]
        return line

    def read_some(self, limit: int) -> bytes:
        if not self.buf:
            self._fill()
        data = bytes(self.buf[:limit])
        del self.buf[:limit]
        return data

    def read_exact(self, n: int) -> bytes:
        out = bytearray()
        while len(out) < n:
            out += self.read_some(n - len(out))
        return bytes(out)

    def take(self) -> bytes:
        data = bytes(self.buf)
        self.buf.clear()
        return data


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """(first line, headers with lower-case names; repeated ones joined by ", ")."""
    lines = head.decode("latin-1").split("\r\n")
    headers: dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            k = k.strip().lower()
            headers[k] = f"{headers[k]}, {v.strip()}" if k in headers else v.strip()
    return lines[0], headers


def relay_body(src: Stream, dst: socket.socket | None, headers: dict[str, str],
               until_close: bool) -> bytes:
    """Copy one message body from src to dst (None: drop it), framed as its headers say.
    Returns the first 64 KB of it (for reading a create's name)."""
    kept = bytearray()

    def out(data: bytes) -> None:
        if len(kept) < CHUNK:
            kept.extend(data[:CHUNK - len(kept)])
        if dst is not None:
            dst.sendall(data)

    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = src.readline()
            out(line)
            size = int(line.split(b";")[0].strip() or b"0", 16)
            if size == 0:
                while True:  # trailers, then the blank line
                    trailer = src.readline()
                    out(trailer)
                    if trailer in (b"\r\n", b"\n"):
                        return bytes(kept)
            left = size + 2  # the data and its CRLF
            while left:
                data = src.read_some(min(left, CHUNK))
                left -= len(data)
                out(data)
    elif "content-length" in headers:
        left = int(headers["content-length"])
        while left:
            data = src.read_some(min(left, CHUNK))
            left -= len(data)
            out(data)
    elif until_close:
        with contextlib.suppress(Closed, OSError):
            while True:
                out(src.read_some(CHUNK))
    return bytes(kept)


def splice(a: Stream, b: Stream) -> None:
    """After an upgrade: bytes both ways until either side closes."""
    for src, dst in ((a, b), (b, a)):
        pending = src.take()
        if pending:
            dst.sock.sendall(pending)
    socks: dict[socket.socket, socket.socket] = {a.sock: b.sock, b.sock: a.sock}
    while True:
        # TLS may hold decrypted bytes select cannot see
        ready: list[socket.socket] = [s for s in socks if isinstance(s, ssl.SSLSocket)
                                      and s.pending()]
        if not ready:
            ready = select.select(list(socks), [], [], 60.0)[0]
        for s in ready:
            try:
                data = s.recv(CHUNK)
            except (ssl.SSLWantReadError, BlockingIOError):
                continue
            except OSError:
                return
            if not data:
                return
            socks[s].sendall(data)


class Faults:
    """The proxy's rules. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._rules: list[Rule] = []
        self._next = 1
        self.requests = 0

    def fire(self, request: Request) -> Rule | None:
        """The rule this request fires (counted), as a copy; None if none."""
        with self._lock:
            self.requests += 1
            rule = pick_rule(self._rules, request)
            if rule is None:
                return None
            rule.fired += 1
            return Rule(**rule.to_json())

    def add(self, spec: dict[str, Any]) -> Rule:
        with self._lock:
            rule = make_rule(f"r{self._next}", spec)
            self._next += 1
            self._rules.append(rule)
            return rule

    def list(self) -> list[dict[str, Any]]:
        with self._lock:
            return [r.to_json() for r in self._rules]

    def remove(self, rule_id: str) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) < before

    def clear(self) -> int:
        with self._lock:
            n = len(self._rules)
            self._rules = []
            return n


class ApiProxy:
    """Listens on listen (TLS with cert/key), forwards to upstream (TLS, checked against ca)."""

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int], cert: str, key: str,
                 ca: str, faults: Faults) -> None:
        self.upstream = upstream
        self.faults = faults
        self.stopping = threading.Event()
        self.server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.server_ctx.load_cert_chain(cert, key)
        self.server_ctx.set_alpn_protocols(["http/1.1"])
        self.client_ctx = ssl.create_default_context(cafile=ca)
        self.client_ctx.set_alpn_protocols(["http/1.1"])
        self.sock = socket.create_server(listen, backlog=128)

    def serve_forever(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(conn,), daemon=True,
                             name="api-conn").start()

    def shutdown(self) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self.sock.close()

    def _serve(self, raw: socket.socket) -> None:
        upstream: Stream | None = None
        try:
            raw.settimeout(UPSTREAM_TIMEOUT_S)
            conn = self.server_ctx.wrap_socket(raw, server_side=True)
            conn.settimeout(None)
            client = Stream(conn)
            while True:
                upstream, keep = self._one(client, upstream)
                if not keep:
                    return
        except (Closed, OSError, ValueError):
            return
        finally:
            with contextlib.suppress(OSError):
                raw.close()
            if upstream is not None:
                with contextlib.suppress(OSError):
                    upstream.sock.close()

    def _connect(self) -> Stream:
        raw = socket.create_connection(self.upstream, timeout=UPSTREAM_TIMEOUT_S)
        sock = self.client_ctx.wrap_socket(raw, server_hostname=self.upstream[0])
        sock.settimeout(None)
        return Stream(sock)

    def _one(self, client: Stream, upstream: Stream | None) -> tuple[Stream | None, bool]:
        """Serve one request. Returns the upstream connection to reuse, and whether the client
        connection goes on."""
        head = client.read_head()
        if head is None:
            return upstream, False
        first, headers = parse_head(head)
        method, target = first.split(" ", 2)[:2]
        request = request_info(method, target)
        rule = self.faults.fire(request)
        client_close = "close" in headers.get("connection", "").lower()
        if rule is not None:
            log.info("fault rule %s fires on %s %s %s: %s", rule.id, request.verb,
                     request.resource, request.namespace or "-", rule.effect())
            if rule.delay:
                self.stopping.wait(rule.delay)
            if rule.code:
                body = relay_body(client, None, headers, until_close=False)
                self._answer(client, rule, request, body_name(body))
                return upstream, not client_close
        if upstream is None:
            upstream = self._connect()
        upstream.sock.sendall(head)
        relay_body(client, upstream.sock, headers, until_close=False)
        resp_head = upstream.read_head()
        if resp_head is None:
            raise Closed()
        status_line, resp_headers = parse_head(resp_head)
        client.sock.sendall(resp_head)
        code = int(status_line.split(" ", 2)[1])
        if code == 101:
            splice(client, upstream)
            return upstream, False
        no_body = method == "HEAD" or code in (204, 304) or 100 <= code < 200
        framed = "content-length" in resp_headers or "chunked" in resp_headers.get(
            "transfer-encoding", "").lower()
        if not no_body:
            relay_body(upstream, client.sock, resp_headers, until_close=not framed)
        server_close = "close" in resp_headers.get("connection", "").lower() or \
            (not framed and not no_body)
        if server_close:
            with contextlib.suppress(OSError):
                upstream.sock.close()
            upstream = None
        return upstream, not client_close and not (not framed and not no_body)

    def _answer(self, client: Stream, rule: Rule, request: Request, name: str) -> None:
        assert rule.code is not None
        doc = fault_status(rule.code, request, name, rule.message)
        data = json.dumps(doc).encode()
        reason = doc["reason"]
        extra = "Retry-After: 1\r\n" if rule.code == 429 else ""
        client.sock.sendall(
            f"HTTP/1.1 {rule.code} {reason}\r\nContent-Type: application/json\r\n"
            f"Cache-Control: no-cache, private\r\n{extra}Content-Length: {len(data)}\r\n\r\n"
            .encode() + data)
