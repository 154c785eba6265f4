"""The `aws` provider: EC2 through aiobotocore, with an embedded catalog in SkyPilot's format."""

from clusterd.providers.aws.provider import AWSProvider

__all__ = ["AWSProvider"]
