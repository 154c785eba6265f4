"""Fault rules of the Kubernetes bed's API proxy, as pure functions: what a request is (its verb,
resource, namespace and name, as the API server's RequestInfo reads them from method and path),
which rule it matches (`pick_rule`), and the Status the API server would answer (`status_body`).

A rule matches a request if every field it names matches; the first rule in creation order
that matches and has firings left wins. Standard library only.
"""

from __future__ import annotations

import dataclasses
import json
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

VERBS = ("create", "get", "list", "watch", "update", "patch", "delete", "deletecollection")
MATCH_FIELDS = ("verb", "resource", "namespace", "name")
MAX_DELAY_S = 900.0
_NAME_RE = re.compile(r"^[a-z0-9]([-a-z0-9./]*[a-z0-9])?$")
# code -> (reason, message template); {what} is `resource "name"` or the resource
STATUSES: dict[int, tuple[str, str]] = {
    400: ("BadRequest", "the request is invalid (injected by the clusterd test bed)"),
    401: ("Unauthorized", "Unauthorized"),
    403: ("Forbidden", '{what} is forbidden: exceeded quota: clusterd-testbed-fault, '
                       'requested: {resource}=1, used: {resource}=0, limited: {resource}=0'),
    404: ("NotFound", "{what} not found"),
    409: ("AlreadyExists", "{what} already exists"),
    410: ("Expired", "too old resource version (injected by the clusterd test bed)"),
    422: ("Invalid", "{what} is invalid (injected by the clusterd test bed)"),
    429: ("TooManyRequests", "the server has received too many requests and has asked us "
                             "to try again later"),
    500: ("InternalError", "Internal error occurred: injected by the clusterd test bed"),
    503: ("ServiceUnavailable", "the server is currently unable to handle the request"),
    504: ("Timeout", "the server was unable to return a response in the time allotted"),
}


@dataclasses.dataclass(frozen=True)
class Request:
    """One API request as the proxy sees it. resource includes a subresource ("pods/exec");
    empty fields for what the request does not have (non-resource URLs like /version)."""

    verb: str
    resource: str = ""
    namespace: str = ""
    name: str = ""
    api_group: str = ""


def request_info(method: str, target: str) -> Request:
    """The verb and resource of a request, read as the API server reads them."""
    url = urllib.parse.urlsplit(target)
    parts = [p for p in url.path.split("/") if p]
    query = urllib.parse.parse_qs(url.query)
    method = method.upper()
    if parts[:1] == ["api"] and len(parts) >= 2:
        group, rest = "", parts[2:]
    elif parts[:1] == ["apis"] and len(parts) >= 3:
        group, rest = parts[1], parts[3:]
    else:
        return Request(verb=method.lower())  # /version, /healthz, /openapi/v2 ...
    watch_prefix = rest[:1] == ["watch"]
    if watch_prefix:
        rest = rest[1:]
    namespace = ""
    if rest[:1] == ["namespaces"] and len(rest) >= 2:
        namespace = rest[1]  # a namespace object is in its own namespace, as upstream has it
        if len(rest) > 2 and rest[2] not in ("status", "finalize"):
            rest = rest[2:]
    resource = rest[0] if rest else ""
    name = rest[1] if len(rest) >= 2 else ""
    if len(rest) >= 3:
        resource = f"{resource}/{rest[2]}"
    if not resource:
        return Request(verb=method.lower(), api_group=group)
    watching = watch_prefix or query.get("watch", [""])[0] in ("1", "true")
    if method in ("GET", "HEAD"):
        verb = "watch" if watching else ("get" if name else "list")
    elif method == "POST":
        verb = "create"
    elif method == "PUT":
        verb = "update"
    elif method == "PATCH":
        verb = "patch"
    elif method == "DELETE":
        verb = "delete" if name else "deletecollection"
    else:
        verb = method.lower()
    return Request(verb=verb, resource=resource, namespace=namespace, name=name,
                   api_group=group)


@dataclasses.dataclass
class Rule:
    """Answer matching requests with `code` (a Status like the API server's), or forward
    them `delay` seconds late (with a code too: answer the code late). count: only the first
    `count` matching requests (None: all). message: instead of the usual one for the code."""

    id: str
    code: int | None = None
    verb: str | None = None
    resource: str | None = None
    namespace: str | None = None
    name: str | None = None
    count: int | None = None
    delay: float | None = None
    message: str | None = None
    fired: int = 0

    @property
    def spent(self) -> bool:
        return self.count is not None and self.fired >= self.count

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        fields = [(n, getattr(self, n)) for n in MATCH_FIELDS]
        return " ".join(f"{n}={v}" for n, v in fields if v is not None) or "every request"

    def effect(self) -> str:
        if self.code and self.delay:
            return f"{self.code} after {self.delay:g}s"
        if self.code:
            return str(self.code)
        return f"forward, answer {self.delay:g}s late"


def make_rule(rule_id: str, spec: dict[str, Any]) -> Rule:
    """A rule from a request's fields; ValueError says what is wrong with them."""
    unknown = set(spec) - {*MATCH_FIELDS, "code", "count", "delay", "message"}
    if unknown:
        raise ValueError(f"unknown rule field(s): {', '.join(sorted(unknown))}")
    code, delay, count = spec.get("code"), spec.get("delay"), spec.get("count")
    if code is None and delay is None:
        raise ValueError("a rule needs --code (or --delay)")
    if code is not None:
        code = int(code)
        if not 400 <= code <= 599:
            raise ValueError(f"--code {code} is not an HTTP error code (400-599)")
    if delay is not None:
        delay = float(delay)
        if not 0 <= delay <= MAX_DELAY_S:
            raise ValueError(f"--delay must be between 0 and {MAX_DELAY_S:g} seconds")
    if count is not None:
        count = int(count)
        if count < 1:
            raise ValueError("--count must be at least 1")
    verb = spec.get("verb") or None
    if verb is not None and verb not in VERBS:
        raise ValueError(f"--verb must be one of {', '.join(VERBS)}")
    for field in ("resource", "namespace", "name"):
        value = spec.get(field)
        if value and not _NAME_RE.match(str(value)):
            raise ValueError(f"--{field} {value!r} is not a Kubernetes name")
    message = spec.get("message") or None
    return Rule(id=rule_id, code=code, verb=verb, resource=spec.get("resource") or None,
                namespace=spec.get("namespace") or None, name=spec.get("name") or None,
                count=count, delay=delay, message=message)


def rule_matches(rule: Rule, request: Request) -> bool:
    for field in MATCH_FIELDS:
        want = getattr(rule, field)
        if want is not None and getattr(request, field) != want:
            return False
    return True


def pick_rule(rules: Iterable[Rule], request: Request) -> Rule | None:
    for rule in rules:
        if not rule.spent and rule_matches(rule, request):
            return rule
    return None


def body_name(body: bytes) -> str:
    """metadata.name (or generateName) of a create's JSON body, "" if it has none."""
    try:
        meta = json.loads(body or b"{}").get("metadata") or {}
    except (ValueError, AttributeError):
        return ""
    return str(meta.get("name") or meta.get("generateName") or "")


def status_body(code: int, request: Request, name: str = "",
                message: str | None = None) -> dict[str, Any]:
    """The Status the API server answers an error with (kind Status, reason, details)."""
    reason, template = STATUSES.get(code, ("InternalError" if code >= 500 else "BadRequest",
                                           "injected by the clusterd test bed"))
    resource = request.resource.split("/")[0] or "resource"
    name = name or request.name
    what = f'{resource} "{name}"' if name else resource
    details: dict[str, Any] = {"kind": resource}
    if name:
        details["name"] = name
    if request.api_group:
        details["group"] = request.api_group
    if code == 429:
        details["retryAfterSeconds"] = 1
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message or template.format(what=what, resource=resource),
            "reason": reason, "details": details, "code": code}
