"""The bed's accounts when it enforces IAM (`ec2 up --iam`), as AWS does: every request is
checked against its caller's policies, and another account's bucket refuses this account's
keys (HeadBucket 403).

Before enforcement is turned on, bootstrap() makes, in moto's default account, the user
`clusterd` holding exactly README's policy (docs/aws-iam-policy.json), whose keys `exec`
hands to clusterd (DIR/aws/credentials), and `testbed-admin`, allowed everything, whose keys
the controller's own calls use (and tests that look behind clusterd's back:
DIR/aws/admin-credentials); and in another account (OTHER_ACCOUNT_ID) the bucket
OTHER_ACCOUNT_BUCKET."""

from __future__ import annotations

import json
import os
from typing import Any

from _testbed.ec2.layout import ACCESS_KEY_ID, MOTO_URL, REPO, SECRET_ACCESS_KEY, BedPaths

README_POLICY = os.path.join(REPO, "docs", "aws-iam-policy.json")
OTHER_ACCOUNT_ID = "222222222222"
OTHER_ACCOUNT_BUCKET = "testbed-other-account"
CLUSTERD_USER = "clusterd"
ADMIN_USER = "testbed-admin"
EVERYTHING = {"Version": "2012-10-17",
              "Statement": [{"Effect": "Allow", "Action": "*", "Resource": "*"}]}
Keys = tuple[str, str]


def _client(service: str, account: str | None = None) -> Any:
    import boto3

    client = boto3.session.Session(
        aws_access_key_id=ACCESS_KEY_ID, aws_secret_access_key=SECRET_ACCESS_KEY,
        region_name="us-east-1").client(service, endpoint_url=MOTO_URL)
    if account is not None:  # moto's way to act in another account
        client.meta.events.register("before-sign.*.*", lambda request, **_: request.headers
                                    .__setitem__("x-moto-account-id", account))
    return client


def _user(iam: Any, name: str, policy: str) -> Keys:
    iam.create_user(UserName=name)
    iam.put_user_policy(UserName=name, PolicyName=name, PolicyDocument=policy)
    key = iam.create_access_key(UserName=name)["AccessKey"]
    return str(key["AccessKeyId"]), str(key["SecretAccessKey"])


def credentials_text(keys: Keys) -> str:
    return f"[default]\naws_access_key_id = {keys[0]}\naws_secret_access_key = {keys[1]}\n"


def _write_private(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(text)


def bootstrap(paths: BedPaths) -> Keys:
    """Make the users and the other account's bucket, write the credentials files; returns
    the admin's keys. Call before enforce()."""
    iam = _client("iam")
    with open(README_POLICY) as f:
        clusterd = _user(iam, CLUSTERD_USER, f.read())
    admin = _user(iam, ADMIN_USER, json.dumps(EVERYTHING))
    _client("s3", OTHER_ACCOUNT_ID).create_bucket(Bucket=OTHER_ACCOUNT_BUCKET)
    _write_private(paths.aws_credentials, credentials_text(clusterd))
    _write_private(paths.admin_credentials, credentials_text(admin))
    return admin


def enforce() -> None:
    """From now on, every request to the in-process moto is checked."""
    from moto import settings
    from moto.core import ActionAuthenticatorMixin

    os.environ["MOTO_S3_ALLOW_CROSSACCOUNT_ACCESS"] = "false"  # read per request
    settings.INITIAL_NO_AUTH_ACTION_COUNT = 0
    ActionAuthenticatorMixin.request_count = 0
