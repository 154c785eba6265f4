"""EC2 errors, as botocore parses real EC2 error documents, mapped to what they rule out."""

from __future__ import annotations

import botocore.session
import pytest
from botocore.exceptions import ClientError, EndpointConnectionError, NoCredentialsError
from botocore.parsers import create_parser

from clusterd.providers.aws.errors import classify
from clusterd.providers.base import BlockScope

EC2_ERROR = ('<?xml version="1.0" encoding="UTF-8"?>\n<Response><Errors><Error><Code>{code}'
             '</Code><Message>{message}</Message></Error></Errors><RequestID>'
             'a1b2c3d4-0000-4000-8000-000000000000</RequestID></Response>')


def ec2_error(code: str, status: int, message: str = "something") -> ClientError:
    """What botocore raises for this EC2 answer: parsed by botocore's own EC2 parser."""
    model = botocore.session.get_session().get_service_model("ec2")
    operation = model.operation_model("RunInstances")
    parsed = create_parser("ec2").parse(
        {"body": EC2_ERROR.format(code=code, message=message).encode(),
         "headers": {"content-type": "text/xml"}, "status_code": status},
        operation.output_shape)
    return ClientError(parsed, "RunInstances")


@pytest.mark.parametrize(("code", "status", "scope"), [
    ("InsufficientInstanceCapacity", 500, BlockScope.ZONE),
    ("InsufficientHostCapacity", 500, BlockScope.ZONE),
    ("Unsupported", 400, BlockScope.ZONE),
    ("SpotMaxPriceTooLow", 400, BlockScope.ZONE),
    ("VcpuLimitExceeded", 400, BlockScope.REGION),
    ("InstanceLimitExceeded", 400, BlockScope.REGION),
    ("MaxSpotInstanceCountExceeded", 400, BlockScope.REGION),
    ("AuthFailure", 401, BlockScope.PROVIDER),
    ("UnauthorizedOperation", 403, BlockScope.PROVIDER),
    ("OptInRequired", 403, BlockScope.PROVIDER),
    ("RequestExpired", 400, BlockScope.PROVIDER),
    ("ExpiredToken", 400, BlockScope.PROVIDER),
    ("InvalidParameterValue", 400, BlockScope.FATAL),
    ("InvalidParameterCombination", 400, BlockScope.FATAL),
    # Only after minutes of retries (throttle.py); EC2 limits per account and region.
    ("RequestLimitExceeded", 503, BlockScope.REGION),
    ("IdempotentParameterMismatch", 400, BlockScope.FATAL),
    ("SomethingNew", 500, BlockScope.ZONE),
    ("SomethingNew", 400, BlockScope.FATAL),
])
def test_codes_block_what_they_rule_out(code: str, status: int, scope: BlockScope) -> None:
    error = classify(ec2_error(code, status, "We currently do not have sufficient capacity"))
    assert error.scope == scope
    assert error.message.startswith(f"{code}: ")


def test_the_message_is_kept_for_the_user() -> None:
    error = classify(ec2_error("InsufficientInstanceCapacity", 500,
                               "We currently do not have sufficient p4d.24xlarge capacity in "
                               "the Availability Zone you requested (us-east-1a)."))
    assert "p4d.24xlarge capacity" in error.message and "us-east-1a" in error.message


def test_missing_credentials_and_unreachable_endpoints_block_the_provider() -> None:
    assert classify(NoCredentialsError()).scope == BlockScope.PROVIDER
    unreachable = classify(EndpointConnectionError(endpoint_url="http://127.0.0.1:9"))
    assert unreachable.scope == BlockScope.PROVIDER and "cannot reach" in unreachable.message
