"""The EC2 test bed's fault rules and error documents (scripts/_testbed/ec2/faults.py), and the
endpoint's bookkeeping (proxy.Endpoint): pure functions, no network."""

from __future__ import annotations

import concurrent.futures
import http.client
import http.server
import sys
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

import pytest
from botocore.parsers import create_parser

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from _testbed.ec2.faults import (
    ERRORS,
    Call,
    credential_scope,
    error_response,
    make_rule,
    parse_call,
    pick_rule,
    rule_matches,
)
from _testbed.ec2.proxy import ApiServer, Endpoint

AUTH = ("AWS4-HMAC-SHA256 Credential=AKIATESTBED000000000/20240927/{region}/{service}/"
        "aws4_request, SignedHeaders=host;x-amz-date, Signature=abc")
SUBNETS = {("us-east-1", "subnet-a"): "us-east-1a", ("us-east-1", "subnet-b"): "us-east-1b"}


def subnet_zone(region: str, subnet_id: str) -> str | None:
    return SUBNETS.get((region, subnet_id))


def call(action: str, region: str = "us-east-1", service: str = "ec2",
         **params: str) -> Call:
    body = urllib.parse.urlencode({"Action": action, "Version": "2016-11-15", **params})
    return parse_call(AUTH.format(region=region, service=service), body.encode(), "",
                      subnet_zone)


def run_instances(zone: str | None = None, subnet: str | None = None, nic_subnet: str | None = None,
                  spot: bool = False, itype: str = "t3.micro", region: str = "us-east-1") -> Call:
    params: dict[str, Any] = {"InstanceType": itype, "MinCount": "1", "MaxCount": "1"}
    if zone:
        params["Placement.AvailabilityZone"] = zone
    if subnet:
        params["SubnetId"] = subnet
    if nic_subnet:
        params["NetworkInterface.1.DeviceIndex"] = "0"
        params["NetworkInterface.1.SubnetId"] = nic_subnet
    if spot:
        params["InstanceMarketOptions.MarketType"] = "spot"
    return call("RunInstances", region=region, **params)


# ---------------------------------------------------------------------------- reading calls


def test_credential_scope() -> None:
    assert credential_scope(AUTH.format(region="eu-west-1", service="sts")) == ("sts", "eu-west-1")
    assert credential_scope(None) == ("", "")
    assert credential_scope("Basic Zm9v") == ("", "")


def test_run_instances_zone_from_placement_subnet_or_interface() -> None:
    assert run_instances(zone="us-east-1c", subnet="subnet-a").zone == "us-east-1c"
    assert run_instances(subnet="subnet-b").zone == "us-east-1b"
    assert run_instances(nic_subnet="subnet-a").zone == "us-east-1a"
    assert run_instances(subnet="subnet-unknown").zone is None
    assert run_instances().zone is None


def test_market_and_type() -> None:
    assert run_instances(spot=True).market == "spot"
    c = run_instances()
    assert (c.market, c.instance_type, c.action, c.region) == \
        ("on-demand", "t3.micro", "RunInstances", "us-east-1")
    d = call("DescribeInstances")
    assert (d.zone, d.market, d.instance_type) == (None, None, None)


def test_query_string_parameters_count_too() -> None:
    c = parse_call(AUTH.format(region="us-west-2", service="ec2"), b"",
                   "Action=DescribeRegions&Version=2016-11-15", subnet_zone)
    assert (c.action, c.region, c.service) == ("DescribeRegions", "us-west-2", "ec2")


# ---------------------------------------------------------------------------- matching


@pytest.mark.parametrize(("field", "value", "hit", "miss"), [
    ("action", "RunInstances", run_instances(), call("DescribeInstances")),
    ("region", "us-west-2", run_instances(region="us-west-2"), run_instances()),
    ("zone", "us-east-1a", run_instances(subnet="subnet-a"), run_instances(subnet="subnet-b")),
    ("instance_type", "p3.2xlarge", run_instances(itype="p3.2xlarge"), run_instances()),
    ("market", "spot", run_instances(spot=True), run_instances()),
])
def test_each_field_matches(field: str, value: str, hit: Call, miss: Call) -> None:
    rule = make_rule("f1", {"code": "InternalError", field: value})
    assert rule_matches(rule, hit)
    assert not rule_matches(rule, miss)


@pytest.mark.parametrize("field", ["zone", "instance_type", "market"])
def test_a_field_the_call_lacks_does_not_match(field: str) -> None:
    value = {"zone": "us-east-1a", "instance_type": "t3.micro", "market": "on-demand"}[field]
    rule = make_rule("f1", {"code": "InternalError", field: value})
    assert not rule_matches(rule, call("DescribeInstances"))


def test_all_named_fields_must_match() -> None:
    rule = make_rule("f1", {"code": "InsufficientInstanceCapacity", "action": "RunInstances",
                            "zone": "us-east-1a", "market": "spot"})
    assert rule_matches(rule, run_instances(zone="us-east-1a", spot=True))
    assert not rule_matches(rule, run_instances(zone="us-east-1a"))
    assert not rule_matches(rule, run_instances(zone="us-east-1b", spot=True))
    assert rule_matches(make_rule("f2", {"code": "InternalError"}), call("DescribeVpcs"))


def test_first_matching_rule_wins_and_count_spends_it() -> None:
    once = make_rule("f1", {"code": "RequestLimitExceeded", "action": "RunInstances",
                            "count": 1})
    other_zone = make_rule("f2", {"code": "Unsupported", "zone": "us-east-1b"})
    always = make_rule("f3", {"code": "InternalError", "action": "RunInstances"})
    rules = [once, other_zone, always]
    c = run_instances(zone="us-east-1a")
    assert pick_rule(rules, c) is once
    once.fired += 1
    assert once.spent
    assert pick_rule(rules, c) is always
    assert pick_rule(rules, run_instances(zone="us-east-1b")) is other_zone
    assert pick_rule(rules, call("DescribeInstances")) is None


def test_a_rule_with_a_share_fires_on_that_share_of_calls() -> None:
    some = make_rule("f1", {"code": "RequestLimitExceeded", "share": 0.3})
    assert some.effect() == "RequestLimitExceeded on 30% of calls"
    draws = iter([0.1, 0.5, 0.29, 0.3])
    fired = [pick_rule([some], call("DescribeInstances"), lambda: next(draws)) is some
             for _ in range(4)]
    assert fired == [True, False, True, False]


@pytest.mark.parametrize(("spec", "error"), [
    ({}, "needs --code"),
    ({"code": "X", "delay": 1, "hang": True}, "exclusive"),
    ({"code": "not a code"}, "is not an error code"),
    ({"code": "X", "count": 0}, "at least 1"),
    ({"code": "X", "market": "reserved"}, "--market"),
    ({"code": "X", "delay": -1}, "--delay"),
    ({"code": "X", "share": 0}, "--share"),
    ({"code": "X", "share": 1.5}, "--share"),
    ({"code": "X", "colour": "red"}, "unknown rule field"),
])
def test_bad_rules_are_refused(spec: dict[str, Any], error: str) -> None:
    with pytest.raises(ValueError, match=error):
        make_rule("f1", spec)


def test_delay_or_hang_without_code() -> None:
    assert make_rule("f1", {"delay": 2}).effect() == "forward, answer 2s late"
    assert make_rule("f1", {"hang": True}).effect() == "forward, never answer"
    assert make_rule("f1", {"code": "InternalError", "delay": 1.5}).effect() == \
        "InternalError after 1.5s"


# ---------------------------------------------------------------------------- documents


def parse_error(service: str, status: int, body: bytes) -> dict[str, Any]:
    parser = create_parser("ec2" if service == "ec2" else "query")
    parsed: dict[str, Any] = parser.parse({"status_code": status, "headers": {}, "body": body},
                                          None)
    return parsed


def test_ec2_error_document() -> None:
    c = run_instances(zone="us-east-1a", itype="p3.2xlarge")
    status, ctype, body = error_response("InsufficientInstanceCapacity", c, request_id="rid-1")
    assert (status, ctype) == (500, "text/xml")
    assert body.startswith(b'<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error>')
    parsed = parse_error("ec2", status, body)
    assert parsed["Error"]["Code"] == "InsufficientInstanceCapacity"
    assert parsed["Error"]["Message"].startswith(
        "We currently do not have sufficient p3.2xlarge capacity in the Availability Zone you "
        "requested (us-east-1a). Our system will be working on provisioning additional capacity.")
    assert parsed["ResponseMetadata"]["RequestId"] == "rid-1"


def test_sts_error_document() -> None:
    c = call("GetCallerIdentity", service="sts")
    status, _, body = error_response("ExpiredToken", c)
    assert body.startswith(b'<ErrorResponse xmlns="https://sts.amazonaws.com/doc/2011-06-15/">'
                           b"<Error><Type>Sender</Type>")
    parsed = parse_error("sts", status, body)
    assert (status, parsed["Error"]["Code"]) == (400, "ExpiredToken")
    assert parsed["Error"]["Message"] == "The security token included in the request is expired"
    status, _, body = error_response("InternalError", c)
    assert b"<Type>Receiver</Type>" in body and status == 500


@pytest.mark.parametrize(("code", "status", "message"), [
    ("InsufficientHostCapacity", 500, None),
    ("InternalError", 500, "An internal error has occurred"),
    ("Unavailable", 503, None),
    ("RequestLimitExceeded", 503, "Request limit exceeded."),
    ("VcpuLimitExceeded", 400, "You have requested more vCPU capacity than your current vCPU "
                               "limit of 32 allows"),
    ("InstanceLimitExceeded", 400, None),
    ("MaxSpotInstanceCountExceeded", 400, None),
    ("SpotMaxPriceTooLow", 400, None),
    ("Unsupported", 400, "Your requested instance type (t3.micro) is not supported in your "
                         "requested Availability Zone (us-east-1a)."),
    ("UnauthorizedOperation", 403, "You are not authorized to perform this operation."),
    ("AuthFailure", 401, "AWS was not able to validate the provided access credentials"),
    ("OptInRequired", 403, None),
    ("ExpiredToken", 400, "The security token included in the request is expired"),
    ("InvalidParameterValue", 400, None),
    ("SomethingNew", 400, "SomethingNew"),
])
def test_status_and_message_per_code(code: str, status: int, message: str | None) -> None:
    got_status, _, body = error_response(code, run_instances(zone="us-east-1a"))
    parsed = parse_error("ec2", got_status, body)
    assert got_status == status
    assert parsed["Error"]["Code"] == code
    assert "{" not in parsed["Error"]["Message"]
    if message:
        assert message in parsed["Error"]["Message"]
    assert code in ERRORS or code == "SomethingNew"


def test_messages_are_escaped() -> None:
    _, _, body = error_response("Unsupported", run_instances(zone="<a&b>", itype="x"))
    assert parse_error("ec2", 400, body)["Error"]["Message"].count("<a&b>") == 1


# ---------------------------------------------------------------------------- endpoint


def test_endpoint_counts_calls_and_fired_rules() -> None:
    ep = Endpoint(subnet_zone)
    rule = ep.add_rule({"code": "InsufficientInstanceCapacity", "zone": "us-east-1a",
                        "count": 2})
    assert rule.id == "f1"
    fired = [ep.observe(run_instances(subnet="subnet-a")) for _ in range(3)]
    assert [r.id if r else None for r in fired] == ["f1", "f1", None]
    assert ep.observe(run_instances(subnet="subnet-b")) is None
    ep.observe(call("DescribeInstances", region="us-west-2"))
    assert [r.fired for r in ep.rules()] == [2]
    assert ep.calls(reset=True) == [
        {"service": "ec2", "action": "DescribeInstances", "region": "us-west-2", "count": 1},
        {"service": "ec2", "action": "RunInstances", "region": "us-east-1", "count": 4},
    ]
    assert ep.calls() == []
    assert ep.add_rule({"delay": 1}).id == "f2"
    assert ep.remove_rule("f1") and not ep.remove_rule("f1")
    assert ep.clear_rules() == 1 and ep.rules() == []


# ---------------------------------------------------------------------------- forwarding

class _CountingUpstream(http.server.ThreadingHTTPServer):
    """Stands where moto does: answers each request after a pause, noting the most requests of
    each service it was answering at once."""

    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _CountingHandler)
        self.lock = threading.Lock()
        self.now: dict[str, int] = {}
        self.most: dict[str, int] = {}


class _CountingHandler(http.server.BaseHTTPRequestHandler):
    server: _CountingUpstream

    def log_message(self, format: str, *args: Any) -> None:
        pass

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        service = credential_scope(self.headers.get("Authorization"))[0]
        with self.server.lock:
            self.server.now[service] = self.server.now.get(service, 0) + 1
            self.server.most[service] = max(self.server.most.get(service, 0),
                                             self.server.now[service])
        time.sleep(0.05)  # long enough for concurrent requests to overlap here if let through
        with self.server.lock:
            self.server.now[service] -= 1
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"{}")


def test_moto_gets_one_ec2_call_at_a_time_and_s3_calls_flow() -> None:
    upstream = _CountingUpstream()
    proxy = ApiServer(("127.0.0.1", 0), upstream.server_address[:2], Endpoint(subnet_zone))
    threads = [threading.Thread(target=s.serve_forever, daemon=True) for s in (upstream, proxy)]
    for thread in threads:
        thread.start()
    try:
        def post(service: str) -> int:
            conn = http.client.HTTPConnection(*proxy.server_address[:2], timeout=30)
            body = urllib.parse.urlencode({"Action": "RunInstances"}).encode()
            conn.request("POST", "/", body, {"Authorization": AUTH.format(
                region="us-east-1", service=service)})
            status = conn.getresponse().status
            conn.close()
            return status

        with concurrent.futures.ThreadPoolExecutor(16) as pool:
            statuses = list(pool.map(post, ["ec2"] * 8 + ["s3"] * 8))
    finally:
        for server in (proxy, upstream):
            server.shutdown()
            server.server_close()
    assert statuses == [200] * 16
    assert upstream.most["ec2"] == 1
    assert upstream.most["s3"] > 1  # the pool sent them together: only EC2 waits its turn
