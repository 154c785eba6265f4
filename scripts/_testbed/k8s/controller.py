"""The Kubernetes bed's controller: a small process in the bed's network namespace (started by
`up` as `ip netns exec NAME python -m _testbed.k8s.controller --dir DIR`) that runs the API
proxy clusterd's contexts talk to (proxy.py: fault rules), and answers the command line on
DIR/control.sock (the EC2 bed's control protocol: one JSON line each way), including HTTP
calls to addresses only reachable inside the namespace (etcd's and the API server's health,
and the API calls `up` and `status` make). It starts and stops nothing else: the components
are the command line's. SIGTERM stops it.
Standard library only.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import ssl
import sys
import threading
import urllib.error
import urllib.request
from typing import Any

from _testbed.common.control import ControlServer, RequestError
from _testbed.k8s.layout import ADMIN_USER, API_PORT, APISERVER_PORT, LOOPBACK, BedPaths
from _testbed.k8s.pki import tokens_of
from _testbed.k8s.proxy import ApiProxy, Faults
from _testbed.k8s.tokens import TokenIssuer

log = logging.getLogger("testbed.k8s.controller")
HTTP_TIMEOUT_S = 30.0
MAX_BODY = 256 * 1024


class Controller:
    def __init__(self, paths: BedPaths) -> None:
        self.paths = paths
        self.faults = Faults()
        pki = paths.pki
        self.proxy = ApiProxy((LOOPBACK, API_PORT), (LOOPBACK, APISERVER_PORT),
                              os.path.join(pki, "proxy.crt"), os.path.join(pki, "proxy.key"),
                              os.path.join(pki, "ca.crt"), self.faults)
        self.tokens = TokenIssuer(self._as_admin)

    def _as_admin(self, method: str, url: str, body: Any) -> dict[str, Any]:
        return self.http(method, url, tokens_of(self.paths)[ADMIN_USER], body)

    def handle(self, op: str, args: dict[str, Any]) -> dict[str, Any]:
        if op == "ping":
            return {"pid": os.getpid()}
        if op == "http":
            return self.http(str(args.get("method") or "GET"), str(args.get("url")),
                             args.get("token"), args.get("body"), args.get("content_type"))
        if op == "token":  # the exec plugin's (exec_credential.py)
            try:
                return self.tokens.issue(float(args.get("ttl") or 20))
            except (RuntimeError, ValueError, KeyError) as e:
                raise RequestError(f"no token: {e}") from e
        if op == "token_stats":
            return {"issued": self.tokens.issued, "revoked": self.tokens.revoked}
        if op == "cluster":
            return self.cluster(str(args.get("url")), str(args.get("token")))
        if op == "fault_add":
            try:
                return {"rule": self.faults.add(dict(args.get("rule") or {})).to_json()}
            except ValueError as e:
                raise RequestError(str(e)) from e
        if op == "fault_list":
            return {"rules": self.faults.list(), "requests": self.faults.requests}
        if op == "fault_remove":
            rule_id = str(args.get("id"))
            if not self.faults.remove(rule_id):
                raise RequestError(f"no fault rule {rule_id}",
                                   hint="`scripts/testbed k8s fault list` shows them")
            return {}
        if op == "fault_clear":
            return {"removed": self.faults.clear()}
        raise RequestError(f"unknown request {op!r}")

    def http(self, method: str, url: str, token: str | None, body: Any = None,
             content_type: str | None = None, limit: int = MAX_BODY) -> dict[str, Any]:
        """One HTTP(S) call from inside the namespace (the bed's CA trusted): {"status": code,
        or 0 if there was no answer, "body": its first `limit` bytes as text}."""
        ctx = ssl.create_default_context(cafile=os.path.join(self.paths.pki, "ca.crt"))
        data = None if body is None else (body if isinstance(body, str)
                                          else json.dumps(body)).encode()
        req = urllib.request.Request(url, data=data, method=method)
        if token:
            req.add_header("Authorization", f"Bearer {token}")
        if data is not None:
            req.add_header("Content-Type", content_type or "application/json")
        try:
            with urllib.request.urlopen(req, timeout=HTTP_TIMEOUT_S, context=ctx) as resp:
                return {"status": resp.status,
                        "body": resp.read(limit).decode(errors="replace")}
        except urllib.error.HTTPError as e:
            return {"status": e.code, "body": e.read(MAX_BODY).decode(errors="replace")}
        except (OSError, ValueError) as e:
            return {"status": 0, "body": str(e)}

    def cluster(self, base: str, token: str) -> dict[str, Any]:
        """Nodes and pods, summarised (a full pod list would not fit a reply line)."""
        out: dict[str, Any] = {}
        for kind in ("nodes", "pods"):
            got = self.http("GET", f"{base}/api/v1/{kind}", token, limit=1 << 30)
            if got["status"] != 200:
                raise RequestError(f"listing {kind} failed ({got['status']}): "
                                   f"{got['body'][:300]}")
            items = json.loads(got["body"])["items"]
            out[kind] = [summary(kind, item) for item in items]
        return out


def summary(kind: str, item: dict[str, Any]) -> dict[str, Any]:
    meta, status, spec = item["metadata"], item.get("status") or {}, item.get("spec") or {}
    conditions = {c["type"]: c for c in status.get("conditions") or []}
    if kind == "nodes":
        ready = conditions.get("Ready", {})
        return {"name": meta["name"], "ready": ready.get("status") == "True",
                "ready_reason": ready.get("reason"), "labels": meta.get("labels") or {},
                "capacity": status.get("capacity") or {},
                "allocatable": status.get("allocatable") or {},
                "taints": [t["key"] for t in spec.get("taints") or []],
                "addresses": {a["type"]: a["address"] for a in status.get("addresses") or []}}
    return {"name": meta["name"], "namespace": meta["namespace"],
            "phase": status.get("phase"), "node": spec.get("nodeName"),
            "ip": status.get("podIP"), "deleting": "deletionTimestamp" in meta,
            "ready": conditions.get("Ready", {}).get("status") == "True"}


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="controller")
    ap.add_argument("--dir", required=True)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(name)s %(levelname)s %(message)s")
    paths = BedPaths(os.path.abspath(args.dir))
    controller = Controller(paths)
    stopping = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stopping.set())
    signal.signal(signal.SIGINT, lambda *_: stopping.set())
    threading.Thread(target=controller.proxy.serve_forever, name="api", daemon=True).start()
    server = ControlServer(paths.control_sock, controller.handle)
    threading.Thread(target=server.serve_forever, name="control", daemon=True).start()
    log.info("ready: pid %d, API proxy on https://%s:%d -> :%d, control socket %s",
             os.getpid(), LOOPBACK, API_PORT, APISERVER_PORT, paths.control_sock)
    stopping.wait()
    log.info("stopping")
    server.shutdown()
    controller.proxy.shutdown()
    controller.tokens.stop()
    with contextlib.suppress(FileNotFoundError):
        os.unlink(paths.control_sock)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
