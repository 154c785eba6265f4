"""Fault rules for the EC2 test bed's API endpoint, as pure functions: what a call is (`Call`,
read from its SigV4 credential scope and form body), which rule a call matches
(`pick_rule`), and the error document EC2 or STS would send (`error_response`).

A rule matches a call if every field it names matches; a rule naming a field the call does not
have (an instance type for DescribeInstances, say) does not match it. Rules are tried in creation
order; the first one that matches and has firings left wins. Standard library only.
"""

from __future__ import annotations

import dataclasses
import random
import re
import urllib.parse
import uuid
from collections.abc import Callable, Iterable
from typing import Any
from xml.sax.saxutils import escape

MARKETS = ("spot", "on-demand")
CODE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9.]{0,99}$")
MAX_DELAY_S = 900.0
_SCOPE_RE = re.compile(r"Credential=[^/,\s]+/\d{8}/([a-z0-9-]+)/([a-z0-9-]+)/aws4_request")
_NIC_SUBNET_RE = re.compile(r"^NetworkInterface\.\d+\.SubnetId$")


@dataclasses.dataclass(frozen=True)
class Call:
    """One API call as the endpoint sees it. Fields a call does not have are None."""

    service: str  # "ec2", "sts"; "" if the request was not signed
    action: str
    region: str
    params: dict[str, str]
    zone: str | None = None  # RunInstances only
    instance_type: str | None = None
    market: str | None = None  # RunInstances only: "spot" or "on-demand"


def credential_scope(authorization: str | None) -> tuple[str, str]:
    """(service, region) from a SigV4 Authorization header; ("", "") if there is none."""
    m = _SCOPE_RE.search(authorization or "")
    return (m.group(2), m.group(1)) if m else ("", "")


def form_params(body: bytes, query: str = "") -> dict[str, str]:
    """A query-protocol call's parameters: the URL's query string and the form body."""
    params: dict[str, str] = {}
    for text in (query, body.decode("utf-8", errors="replace")):
        for k, v in urllib.parse.parse_qsl(text, keep_blank_values=True):
            params.setdefault(k, v)
    return params


def parse_call(authorization: str | None, body: bytes, query: str,
               subnet_zone: Callable[[str, str], str | None]) -> Call:
    """Describe a call. subnet_zone(region, subnet_id) gives a subnet's availability zone."""
    service, region = credential_scope(authorization)
    # S3 speaks REST: its bodies are objects, not forms (and may be large).
    params = form_params(b"" if service == "s3" else body, query)
    action = params.get("Action", "")
    zone = market = None
    if action == "RunInstances":
        zone = params.get("Placement.AvailabilityZone") or None
        if zone is None:
            subnets = [params["SubnetId"]] if params.get("SubnetId") else []
            subnets += [v for k, v in sorted(params.items()) if _NIC_SUBNET_RE.match(k) and v]
            for subnet in subnets:
                zone = subnet_zone(region, subnet)
                if zone:
                    break
        market = "spot" if params.get("InstanceMarketOptions.MarketType") == "spot" \
            else "on-demand"
    return Call(service=service, action=action, region=region, params=params, zone=zone,
                instance_type=params.get("InstanceType") or None, market=market)


@dataclasses.dataclass
class Rule:
    """Fail (code), slow down (delay) or swallow the answer of (hang) matching calls.

    code without delay/hang: answer the error at once, without forwarding. code with delay: wait,
    then answer the error. delay alone: forward, answer moto's reply late. hang: forward, never
    answer. count: only the first `count` matching calls (None: all). share: fire on that
    fraction of the matching calls, at random (throttling hits some calls, not all; None: all)."""

    id: str
    code: str | None = None
    action: str | None = None
    region: str | None = None
    zone: str | None = None
    instance_type: str | None = None
    market: str | None = None
    count: int | None = None
    delay: float | None = None
    hang: bool = False
    share: float | None = None
    fired: int = 0

    @property
    def spent(self) -> bool:
        return self.count is not None and self.fired >= self.count

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def describe(self) -> str:
        """What the rule matches, for people: "action=RunInstances zone=us-east-1a"."""
        fields = [(n, getattr(self, n)) for n in MATCH_FIELDS]
        return " ".join(f"{n.replace('_', '-')}={v}" for n, v in fields if v is not None) \
            or "every call"

    def effect(self) -> str:
        if self.hang:
            return "forward, never answer"
        if self.code and self.delay:
            return f"{self.code} after {self.delay:g}s"
        if self.code:
            return self.code + (f" on {self.share:.0%} of calls" if self.share is not None
                                else "")
        return f"forward, answer {self.delay:g}s late"


MATCH_FIELDS = ("action", "region", "zone", "instance_type", "market")


def make_rule(rule_id: str, spec: dict[str, Any]) -> Rule:
    """A rule from a request's fields; ValueError says what is wrong with them."""
    unknown = set(spec) - {*MATCH_FIELDS, "code", "count", "delay", "hang", "share"}
    if unknown:
        raise ValueError(f"unknown rule field(s): {', '.join(sorted(unknown))}")
    code, delay, hang, count = spec.get("code"), spec.get("delay"), bool(spec.get("hang")), \
        spec.get("count")
    if delay is not None and hang:
        raise ValueError("--delay and --hang are exclusive")
    if code is None and delay is None and not hang:
        raise ValueError("a rule needs --code (or --delay or --hang)")
    if code is not None and not CODE_RE.match(str(code)):
        raise ValueError(f"--code {code!r} is not an error code like InsufficientInstanceCapacity")
    if delay is not None:
        delay = float(delay)
        if not 0 <= delay <= MAX_DELAY_S:
            raise ValueError(f"--delay must be between 0 and {MAX_DELAY_S:g} seconds")
    if count is not None:
        count = int(count)
        if count < 1:
            raise ValueError("--count must be at least 1")
    share = spec.get("share")
    if share is not None:
        share = float(share)
        if not 0 < share <= 1:
            raise ValueError("--share must be above 0 and at most 1")
    market = spec.get("market")
    if market is not None and market not in MARKETS:
        raise ValueError(f"--market must be one of {', '.join(MARKETS)}")
    def field(name: str) -> str | None:
        value = spec.get(name)
        return None if value in (None, "") else str(value)

    return Rule(id=rule_id, code=code, action=field("action"), region=field("region"),
                zone=field("zone"), instance_type=field("instance_type"), market=field("market"),
                count=count, delay=delay, hang=hang, share=share)


def rule_matches(rule: Rule, call: Call) -> bool:
    """Every field the rule names is the call's (spent rules are pick_rule's business)."""
    for name in MATCH_FIELDS:
        want = getattr(rule, name)
        if want is not None and getattr(call, name) != want:
            return False
    return True


def pick_rule(rules: Iterable[Rule], call: Call,
              draw: Callable[[], float] = random.random) -> Rule | None:
    """The first rule, in creation order, that matches the call, has firings left and (with a
    share) fires this time (`draw()` below the share)."""
    for rule in rules:
        if not rule.spent and rule_matches(rule, call) and (
                rule.share is None or draw() < rule.share):
            return rule
    return None


# ---------------------------------------------------------------------------- error documents

_CAPACITY_HINT = ("Our system will be working on provisioning additional capacity. You can "
                  "currently get {type} capacity by not specifying an Availability Zone in your "
                  "request or choosing another Availability Zone.")
# code -> (HTTP status, message); {type}, {zone}, {action} are filled in from the call
ERRORS: dict[str, tuple[int, str]] = {
    "InsufficientInstanceCapacity": (
        500, "We currently do not have sufficient {type} capacity in the Availability Zone you "
             "requested ({zone}). " + _CAPACITY_HINT),
    "InsufficientHostCapacity": (
        500, "There is not enough capacity to fulfill your Dedicated Host request in the "
             "Availability Zone you requested ({zone})."),
    "InternalError": (500, "An internal error has occurred"),
    "Unavailable": (503, "The service is unavailable. Please try again shortly."),
    "RequestLimitExceeded": (503, "Request limit exceeded."),
    "VcpuLimitExceeded": (
        400, "You have requested more vCPU capacity than your current vCPU limit of 32 allows "
             "for the instance bucket that the specified instance type belongs to. Please visit "
             "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this "
             "limit."),
    "InstanceLimitExceeded": (
        400, "You have requested more instances (1) than your current instance limit of 0 "
             "allows for the specified instance type. Please visit "
             "http://aws.amazon.com/contact-us/ec2-request to request an adjustment to this "
             "limit."),
    "MaxSpotInstanceCountExceeded": (400, "Max spot instance count exceeded"),
    "SpotMaxPriceTooLow": (
        400, "Your Spot request price is lower than the minimum required Spot request "
             "fulfillment price for {type} in {zone}."),
    "Unsupported": (
        400, "Your requested instance type ({type}) is not supported in your requested "
             "Availability Zone ({zone}). Please retry your request by not specifying an "
             "Availability Zone or choosing another Availability Zone."),
    "UnauthorizedOperation": (
        403, "You are not authorized to perform this operation. User: "
             "arn:aws:iam::123456789012:user/testbed is not authorized to perform: "
             "ec2:{action} because no identity-based policy allows the ec2:{action} action"),
    "AuthFailure": (401, "AWS was not able to validate the provided access credentials"),
    "OptInRequired": (
        403, "You are not subscribed to this service. Please go to http://aws.amazon.com to "
             "subscribe."),
    "ExpiredToken": (400, "The security token included in the request is expired"),
    "InvalidParameterValue": (400, "Invalid value for a parameter of {action}."),
}
GENERIC_ERROR = (400, "The request failed with {code} (injected by the clusterd test bed).")
STS_NS = "https://sts.amazonaws.com/doc/2011-06-15/"


def error_message(code: str, call: Call) -> tuple[int, str]:
    """(HTTP status, message) EC2 answers with for code, filled in from the call."""
    status, template = ERRORS.get(code, GENERIC_ERROR)
    return status, template.format(
        code=code, action=call.action or "the requested action",
        type=call.instance_type or "the requested instance type",
        zone=call.zone or "the requested zone")


def error_response(code: str, call: Call,
                   request_id: str | None = None) -> tuple[int, str, bytes]:
    """(HTTP status, Content-Type, body) of the error document for code, in the form the call's
    service uses: EC2's <Response><Errors>, or STS's <ErrorResponse>."""
    status, message = error_message(code, call)
    rid = request_id or str(uuid.uuid4())
    if call.service == "sts":
        kind = "Receiver" if status >= 500 else "Sender"
        body = (f'<ErrorResponse xmlns="{STS_NS}"><Error><Type>{kind}</Type>'
                f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
                f"<RequestId>{rid}</RequestId></ErrorResponse>")
    else:
        body = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>'
                f"<Code>{escape(code)}</Code><Message>{escape(message)}</Message></Error>"
                f"</Errors><RequestID>{rid}</RequestID></Response>")
    return status, "text/xml", body.encode()
