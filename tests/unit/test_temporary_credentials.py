"""The launch's warning when the credentials sent to nodes for buckets are temporary
(storage/service.temporary_credentials_warning): when they expire, and what to do."""

from __future__ import annotations

import datetime

from clusterd.providers.aws.ec2 import CredentialsLifetime
from clusterd.storage.service import temporary_credentials_warning

NOW = datetime.datetime(2026, 12, 6, 4, 0, tzinfo=datetime.UTC)


def test_an_expiry_is_given_as_a_time_and_a_delay() -> None:
    text = temporary_credentials_warning(
        CredentialsLifetime("sso", NOW + datetime.timedelta(minutes=42)), 3, NOW)
    assert text.startswith("the AWS credentials sent to 3 nodes for buckets are temporary "
                           "(sso) and expire at 2026-12-06 04:42:00 UTC (in 42 min)")
    assert "long-lived keys" in text


def test_an_unknown_or_past_expiry_is_said_as_such() -> None:
    unknown = temporary_credentials_warning(CredentialsLifetime("env", None), 1, NOW)
    assert "1 node for" in unknown and "an expiry clusterd cannot see" in unknown
    past = temporary_credentials_warning(
        CredentialsLifetime("assume-role", NOW - datetime.timedelta(minutes=1)), 1, NOW)
    assert "expire already (2026-12-06 03:59:00 UTC)" in past
