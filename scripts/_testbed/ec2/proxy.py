"""The API endpoint clients call (127.0.0.1:4566 in the bed's namespace): every request is
forwarded to moto unchanged and its answer relayed, except where a fault rule says otherwise.
Calls are counted by (service, action, region). Standard library only; the zone of a subnet is
looked up through a function the controller passes in."""

from __future__ import annotations

import collections
import http.client
import logging
import select
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from _testbed.common import assert_loopback
from _testbed.ec2.faults import Call, Rule, error_response, make_rule, parse_call, pick_rule

log = logging.getLogger("testbed.ec2.proxy")

HANG_MAX_S = 900.0  # a hung call is held at most this long (15 min)
# moto's EC2 models are not thread-safe (its server answers each request on a thread of its
# own): two RunInstances at once can draw from one subnet's address generator together, and a
# Describe can iterate a dict another call changes. EC2 is consistent under concurrent calls,
# so the bed hands moto one EC2 call at a time (they take milliseconds); S3 and the rest flow.
SERIALIZED_SERVICES = frozenset({"ec2"})
UPSTREAM_TIMEOUT_S = 120.0
HOP_BY_HOP = {"connection", "keep-alive", "proxy-authenticate", "proxy-authorization", "te",
              "trailers", "transfer-encoding", "upgrade", "content-length"}


class Endpoint:
    """The endpoint's bookkeeping: call counts and fault rules. Thread-safe."""

    def __init__(self, subnet_zone: Callable[[str, str], str | None],
                 on_call: Callable[[str, str], None] | None = None) -> None:
        self.subnet_zone = subnet_zone
        self.on_call = on_call  # (service, action) of every call, as it comes
        self.stopping = threading.Event()
        self._lock = threading.Lock()
        self.upstream_lock = threading.Lock()  # held while moto answers a SERIALIZED_SERVICES call
        self._counts: collections.Counter[tuple[str, str, str]] = collections.Counter()
        self._rules: list[Rule] = []
        self._next_id = 1

    def observe(self, call: Call) -> Rule | None:
        """Count the call; return the rule it fires (and count that firing), if any."""
        if self.on_call is not None:
            self.on_call(call.service, call.action)
        with self._lock:
            self._counts[(call.service, call.action, call.region)] += 1
            rule = pick_rule(self._rules, call)
            if rule is not None:
                rule.fired += 1
                return Rule(**rule.to_json())  # a copy: the handler must not see later edits
            return None

    def calls(self, reset: bool = False) -> list[dict[str, Any]]:
        with self._lock:
            out = [{"service": s, "action": a, "region": r, "count": n}
                   for (s, a, r), n in sorted(self._counts.items())]
            if reset:
                self._counts.clear()
        return out

    def add_rule(self, spec: dict[str, Any]) -> Rule:
        with self._lock:
            rule = make_rule(f"f{self._next_id}", spec)
            self._next_id += 1
            self._rules.append(rule)
            return rule

    def rules(self) -> list[Rule]:
        with self._lock:
            return [Rule(**r.to_json()) for r in self._rules]

    def remove_rule(self, rule_id: str) -> bool:
        with self._lock:
            before = len(self._rules)
            self._rules = [r for r in self._rules if r.id != rule_id]
            return len(self._rules) != before

    def clear_rules(self) -> int:
        with self._lock:
            n = len(self._rules)
            self._rules = []
            return n


class ApiServer(ThreadingHTTPServer):
    daemon_threads = True
    allow_reuse_address = True
    request_queue_size = 128  # a daemon refreshing many clusters calls in bursts

    def __init__(self, address: tuple[str, int], upstream: tuple[str, int],
                 endpoint: Endpoint) -> None:
        assert_loopback(address[0])
        assert_loopback(upstream[0])
        self.upstream = upstream
        self.endpoint = endpoint
        super().__init__(address, ApiHandler)


class ApiHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: ApiServer

    def log_message(self, format: str, *args: Any) -> None:
        pass  # one line per call would drown the controller's log

    def do_POST(self) -> None:
        self._handle()

    do_GET = do_PUT = do_DELETE = do_HEAD = do_POST

    def _read_body(self) -> bytes:
        """The request's body, sent with a length or in chunks (S3 clients stream uploads
        chunked: rclone does); forwarded with its length either way."""
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            parts = []
            while True:
                size = int(self.rfile.readline().split(b";")[0].strip() or b"0", 16)
                if size == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass  # trailers
                    return b"".join(parts)
                parts.append(self.rfile.read(size))
                self.rfile.readline()  # the CRLF after each chunk
        length = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(length) if length else b""

    def _handle(self) -> None:
        body = self._read_body()
        query = self.path.partition("?")[2]
        endpoint = self.server.endpoint
        try:
            call = parse_call(self.headers.get("Authorization"), body, query,
                              endpoint.subnet_zone)
        except Exception:  # a request we cannot read is still forwarded, and counted as such
            log.exception("could not read a request to %s", self.path)
            call = Call(service="", action="", region="", params={})
        rule = endpoint.observe(call)
        if rule is not None:
            log.info("fault rule %s fires on %s %s in %s: %s", rule.id, call.service,
                     call.action, call.region, rule.effect())
        if rule is not None and rule.hang:
            self._forward(body, call)
            self._hold()
            return
        if rule is not None and rule.code:
            if rule.delay:
                self._sleep(rule.delay)
            status, ctype, doc = error_response(rule.code, call)
            self._reply(status, [("Content-Type", ctype)], doc)
            return
        answer = self._forward(body, call)
        if rule is not None and rule.delay:
            self._sleep(rule.delay)
        if answer is None:
            status, ctype, doc = error_response("InternalError", call)
            self._reply(status, [("Content-Type", ctype)], doc)
        else:
            self._reply(*answer)

    def _forward(self, body: bytes, call: Call) -> tuple[int, list[tuple[str, str]], bytes] | None:
        """Send the request to moto as it came; (status, headers, body), None if moto failed."""
        if call.service in SERIALIZED_SERVICES:
            with self.server.endpoint.upstream_lock:
                return self._forward_now(body)
        return self._forward_now(body)

    def _forward_now(self, body: bytes) -> tuple[int, list[tuple[str, str]], bytes] | None:
        host, port = self.server.upstream
        conn = http.client.HTTPConnection(host, port, timeout=UPSTREAM_TIMEOUT_S)
        try:
            conn.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
            for k, v in self.headers.items():
                if k.lower() not in HOP_BY_HOP:
                    conn.putheader(k, v)
            conn.putheader("Content-Length", str(len(body)))
            conn.endheaders(body)
            resp = conn.getresponse()
            data = resp.read()
            headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in HOP_BY_HOP]
            if self.command == "HEAD":  # no body, but the length of the one a GET would get
                headers += [(k, v) for k, v in resp.getheaders() if k.lower() == "content-length"]
            return resp.status, headers, data
        except (OSError, http.client.HTTPException) as e:
            log.error("moto did not answer %s %s: %s", self.command, self.path, e)
            return None
        finally:
            conn.close()

    def _reply(self, status: int, headers: list[tuple[str, str]], body: bytes) -> None:
        self.send_response_only(status)
        for k, v in headers:
            self.send_header(k, v)
        if not any(k.lower() == "content-length" for k, _ in headers):
            self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.wfile.flush()

    def _sleep(self, seconds: float) -> None:
        self.server.endpoint.stopping.wait(seconds)

    def _hold(self) -> None:
        """Never answer: keep the connection open until the client goes away (or 15 min)."""
        self.close_connection = True
        sock = self.connection
        deadline = time.monotonic() + HANG_MAX_S
        while time.monotonic() < deadline and not self.server.endpoint.stopping.is_set():
            readable, _, _ = select.select([sock], [], [], 1.0)
            if readable:
                try:
                    if not sock.recv(65536):
                        return  # the client closed its end
                except OSError:
                    return
