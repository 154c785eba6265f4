"""A bed controller's control socket (both beds': DIR/control.sock, mode 0600): one JSON
request line {"op": NAME, ...arguments} in, one JSON reply line out ({"ok": true, ...} or
{"ok": false, "error": MESSAGE, "hint": HINT}). A Unix socket path works across network
namespaces, so the command line outside the bed's namespace talks to the controller inside it.
Standard library only."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import socketserver
from collections.abc import Callable
from typing import Any

from _testbed.common import Failure

log = logging.getLogger("testbed.control")

MAX_LINE = 1 << 20
Handler = Callable[[str, dict[str, Any]], dict[str, Any]]


class RequestError(Exception):
    """A request the controller refuses; becomes {"ok": false, "error", "hint"}."""

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.hint = hint


def request(sock_path: str, op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
    """Send one request; the reply's fields. Raises Failure if the controller cannot be reached
    or refuses the request."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout)
            s.connect(sock_path)
            s.sendall(json.dumps({"op": op, **args}).encode() + b"\n")
            with s.makefile("rb") as f:
                line = f.readline(MAX_LINE)
    except (OSError, TimeoutError) as e:
        raise Failure(f"the bed's controller does not answer on {sock_path}: {e}",
                      hint="see its log (controller.log in the bed's directory); "
                           "`scripts/testbed ec2 down` and `up` again to start over") from e
    if not line:
        raise Failure(f"the bed's controller closed {sock_path} without answering")
    reply = json.loads(line)
    if not reply.get("ok"):
        raise Failure(reply.get("error") or "the controller refused the request",
                      hint=reply.get("hint"))
    return dict(reply)


class _RequestHandler(socketserver.StreamRequestHandler):
    server: ControlServer

    def handle(self) -> None:
        line = self.rfile.readline(MAX_LINE)
        if not line:
            return
        try:
            req = json.loads(line)
            if not isinstance(req, dict) or not isinstance(req.get("op"), str):
                raise RequestError("a request is a JSON object with an 'op'")
            op = req.pop("op")
            reply = {"ok": True, **self.server.handler(op, req)}
        except RequestError as e:
            reply = {"ok": False, "error": str(e), "hint": e.hint}
        except ValueError as e:  # bad JSON, bad arguments
            reply = {"ok": False, "error": str(e), "hint": None}
        except Exception as e:
            log.exception("control request failed")
            reply = {"ok": False, "error": f"the controller failed: {e!r}",
                     "hint": "see controller.log in the bed's directory"}
        with contextlib.suppress(OSError):
            self.wfile.write(json.dumps(reply).encode() + b"\n")


class ControlServer(socketserver.ThreadingUnixStreamServer):
    daemon_threads = True

    def __init__(self, path: str, handler: Handler) -> None:
        self.handler = handler
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        old = os.umask(0o077)  # 0600 from the start, not after a chmod
        try:
            super().__init__(path, _RequestHandler)
        finally:
            os.umask(old)
        os.chmod(path, 0o600)
