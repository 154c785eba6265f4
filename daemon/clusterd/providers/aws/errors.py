"""EC2 errors → what they rule out. The one place botocore's exceptions are understood.

Capacity is scarce per zone, quotas end at region borders, and credentials are the whole
provider's; a malformed request is fatal, since no other placement fixes it. Throttling gets
here only once EC2Api.call has ridden it out for minutes (throttle.py): EC2 limits request
rates per account and region, so it rules out the region (another may still answer).
"""

from __future__ import annotations

from botocore.exceptions import (
    BotoCoreError,
    ClientError,
    NoCredentialsError,
    NoRegionError,
    PartialCredentialsError,
    ReadTimeoutError,
)
from botocore.exceptions import (
    ConnectionError as BotoConnectionError,
)

from clusterd.providers.aws.throttle import THROTTLING_CODES
from clusterd.providers.base import BlockScope, ProvisionError

ZONE_CODES = frozenset({
    "InsufficientInstanceCapacity", "InsufficientHostCapacity",
    "InsufficientReservedInstanceCapacity", "InsufficientCapacity", "Unsupported",
    "SpotMaxPriceTooLow", "InsufficientFreeAddressesInSubnet", "InternalError",
    "Unavailable", "ServiceUnavailable", "InsufficientAddressCapacity",
})
REGION_CODES = frozenset({
    "VcpuLimitExceeded", "InstanceLimitExceeded", "MaxSpotInstanceCountExceeded",
    "InvalidAMIID.NotFound", "InvalidAMIID.Unavailable", "AddressLimitExceeded",
    "SecurityGroupLimitExceeded", "VPCLimitExceeded", "InvalidVpcID.NotFound",
})
PROVIDER_CODES = frozenset({
    "AuthFailure", "UnauthorizedOperation", "OptInRequired", "ExpiredToken",
    "ExpiredTokenException", "RequestExpired", "InvalidClientTokenId", "SignatureDoesNotMatch",
    "UnrecognizedClientException", "InvalidAccessKeyId", "AccessDenied",
    "AccessDeniedException", "Blocked", "PendingVerification",
})
# The first few words are enough in a progress line; the whole message goes to events.
MESSAGE_LIMIT = 400


def error_code(error: BaseException) -> str | None:
    if isinstance(error, ClientError):
        return str(error.response.get("Error", {}).get("Code") or "") or None
    return None


def classify(error: BaseException, where: str = "aws") -> ProvisionError:
    """A ProvisionError saying what `error` rules out, its message starting with the EC2
    error code (`InsufficientInstanceCapacity: We currently do not have ...`)."""
    if isinstance(error, ProvisionError):
        return error
    if isinstance(error, ClientError):
        code = error_code(error) or "UnknownError"
        message = str(error.response.get("Error", {}).get("Message") or "").strip()
        text = f"{code}: {message}"[:MESSAGE_LIMIT] if message else code
        status = int(error.response.get("ResponseMetadata", {}).get("HTTPStatusCode") or 0)
        if code in ZONE_CODES:
            return ProvisionError(text, BlockScope.ZONE)
        if code in REGION_CODES:
            return ProvisionError(text, BlockScope.REGION)
        if code in PROVIDER_CODES:
            return ProvisionError(text, BlockScope.PROVIDER,
                                  "check your AWS credentials and permissions "
                                  "(`clusterctl check` shows what clusterd sees)")
        if code in THROTTLING_CODES:
            return ProvisionError(text, BlockScope.REGION,
                                  "AWS is limiting this account's request rate in this region; "
                                  "retry later, or ask AWS for a higher limit", throttled=True)
        if code == "IdempotentParameterMismatch":
            return ProvisionError(text, BlockScope.FATAL,
                                  "a resumed launch asked EC2 for other instances than the "
                                  "attempt it resumes; `clusterctl down` it and launch again")
        if status >= 500:
            return ProvisionError(text, BlockScope.ZONE)
        return ProvisionError(text, BlockScope.FATAL)
    if isinstance(error, NoCredentialsError | PartialCredentialsError):
        return ProvisionError(f"{where}: no usable AWS credentials: {error}",
                              BlockScope.PROVIDER,
                              "configure them (aws configure, AWS_PROFILE or the AWS_* "
                              "environment variables), then `clusterctl check`")
    if isinstance(error, NoRegionError):
        return ProvisionError(f"{where}: no region given", BlockScope.FATAL)
    if isinstance(error, ReadTimeoutError):
        return ProvisionError(f"{where}: the EC2 API did not answer in time ({error})",
                              BlockScope.ZONE)
    if isinstance(error, BotoConnectionError):
        return ProvisionError(f"{where}: cannot reach the AWS API: {error}",
                              BlockScope.PROVIDER, "check the network or the endpoint settings")
    if isinstance(error, BotoCoreError):
        return ProvisionError(f"{where}: {error}", BlockScope.FATAL)
    if isinstance(error, TimeoutError):
        return ProvisionError(f"{where}: timed out", BlockScope.ZONE)
    return ProvisionError(f"{where}: {type(error).__name__}: {error}", BlockScope.FATAL)
