"""Short-lived tokens for the bed's exec-plugin contexts, issued by the controller (op
`token`): a Secret made for each token, a TokenRequest for the contexts' service account bound
to that Secret, and the Secret deleted when the token is said to expire. The API server then
refuses the token (after its authentication cache of 10 s at most): it really expires, though
TokenRequest's own expirationSeconds cannot go below 10 minutes.
Standard library only (the controller's)."""

from __future__ import annotations

import datetime
import json
import logging
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from _testbed.k8s.layout import APISERVER_URL, EXEC_NAMESPACE, EXEC_SERVICE_ACCOUNT

log = logging.getLogger("testbed.k8s.tokens")

MIN_EXPIRATION_S = 600  # TokenRequest's floor
LABEL = "clusterd.testbed/token-of"

# (method, url, body) → {"status": code, "body": text}: the controller's HTTP, as the admin.
Http = Callable[[str, str, Any], dict[str, Any]]


class TokenIssuer:
    def __init__(self, http: Http) -> None:
        self._http = http
        self._timers: set[threading.Timer] = set()
        self._lock = threading.Lock()
        self.issued = 0
        self.revoked = 0

    def _ok(self, method: str, path: str, body: Any = None) -> dict[str, Any]:
        got = self._http(method, f"{APISERVER_URL}{path}", body)
        if got["status"] not in (200, 201):
            raise RuntimeError(f"{method} {path}: {got['status']} {got['body'][:300]}")
        result: dict[str, Any] = json.loads(got["body"])
        return result

    def issue(self, ttl_s: float) -> dict[str, Any]:
        """A token good for ttl_s seconds: {"token", "expirationTimestamp"} (RFC 3339)."""
        namespace = EXEC_NAMESPACE
        name = f"{EXEC_SERVICE_ACCOUNT}-token-{secrets.token_hex(4)}"
        secret = self._ok("POST", f"/api/v1/namespaces/{namespace}/secrets", {
            "apiVersion": "v1", "kind": "Secret",
            "metadata": {"name": name, "labels": {LABEL: EXEC_SERVICE_ACCOUNT}}})
        request = {"apiVersion": "authentication.k8s.io/v1", "kind": "TokenRequest",
                   "spec": {"expirationSeconds": MIN_EXPIRATION_S,
                            "boundObjectRef": {"apiVersion": "v1", "kind": "Secret",
                                               "name": name,
                                               "uid": secret["metadata"]["uid"]}}}
        got = self._ok("POST", f"/api/v1/namespaces/{namespace}/serviceaccounts/"
                               f"{EXEC_SERVICE_ACCOUNT}/token", request)
        expires = time.time() + ttl_s
        timer = threading.Timer(ttl_s, self._revoke, (namespace, name))
        timer.daemon = True
        with self._lock:
            self._timers.add(timer)
            self.issued += 1
        timer.start()
        log.info("issued a token bound to secret %s, revoked in %.0f s", name, ttl_s)
        when = datetime.datetime.fromtimestamp(expires, datetime.UTC)
        return {"token": got["status"]["token"],
                "expirationTimestamp": when.strftime("%Y-%m-%dT%H:%M:%SZ")}

    def _revoke(self, namespace: str, name: str) -> None:
        got = self._http("DELETE", f"{APISERVER_URL}/api/v1/namespaces/{namespace}/secrets/"
                                   f"{name}", None)
        with self._lock:
            self._timers = {t for t in self._timers if t.is_alive()}
            self.revoked += 1
        log.info("revoked the token of secret %s (%s)", name, got["status"])

    def stop(self) -> None:
        with self._lock:
            for timer in self._timers:
                timer.cancel()
            self._timers.clear()
