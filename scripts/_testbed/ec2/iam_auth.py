"""What IAM does that moto does not, for a bed that enforces IAM:
- a call naming a role or an instance profile is checked against that role's or profile's
  ARN, whether or not it exists yet. moto checks CreateRole, GetRole of a missing role and
  every instance-profile call against "*", so a policy scoped to `role/clusterd-*-node`
  (README's) would be refused there while AWS allows it;
- S3's HeadBucket needs s3:ListBucket (there is no s3:HeadBucket action); moto asks for the
  latter, which no real policy grants.
install() makes moto check as AWS does.

Run as a script, it is moto's server with this installed (`iam_auth.py -H 127.0.0.1 -p N`):
the integration tests start it so, with enforcement turned on after their bootstrap
(POST /moto-api/reset-auth)."""

from __future__ import annotations

import sys
from typing import Any

_installed = False


def resource_of(account: str, data: dict[str, Any]) -> str:
    """The ARN IAM checks a call's permission against: its role, else its instance
    profile, else "*"."""
    for field, kind in (("RoleName", "role"), ("InstanceProfileName", "instance-profile")):
        value = data.get(field)
        if value:
            name = value[0] if isinstance(value, list) else value
            return f"arn:aws:iam::{account}:{kind}/{name}"
    return "*"


def install() -> None:
    """Idempotent."""
    global _installed
    if _installed:
        return
    from moto.iam.responses import IamResponse

    def determine_resource(self: Any) -> str:
        return resource_of(self.current_account, self.data)

    IamResponse._determine_resource = determine_resource  # type: ignore[method-assign]
    from moto.s3.responses import ACTION_MAP

    ACTION_MAP["BUCKET"]["HEAD"]["DEFAULT"] = "ListBucket"
    _installed = True


if __name__ == "__main__":
    install()
    from moto.server import main

    main(sys.argv[1:])
