"""The instance profile that lets a cluster's nodes use the S3 buckets its tasks mount, so no
credentials of the user's ever reach a cloud VM.

One role and one instance profile, both named ROLE, made once per account on first need. The
role's one inline policy grants exactly the buckets tasks have named (listing, and reading and
writing objects): each launch that names a new bucket adds it, and none is ever removed while
a cluster may still use it. The nodes get the role's temporary credentials from the instance
metadata service, as every AWS SDK (botocore, rclone) finds them, with no file on the node.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import unquote

import anyio

from clusterd import log
from clusterd.providers.aws.ec2 import EC2Api
from clusterd.providers.base import BlockScope, ProvisionError

logger = log.get("clusterd.aws")

ROLE = "clusterd-node"
POLICY = "clusterd-buckets"
IAM_REGION = "us-east-1"  # IAM is global; its endpoint answers from here
# An inline role policy may hold 10,240 characters (IAM's quota).
POLICY_LIMIT = 10_240
TRUST = {"Version": "2012-10-17", "Statement": [{
    "Effect": "Allow", "Principal": {"Service": "ec2.amazonaws.com"},
    "Action": "sts:AssumeRole"}]}
BUCKET_ACTIONS = ["s3:ListBucket", "s3:GetBucketLocation", "s3:ListBucketMultipartUploads"]
OBJECT_ACTIONS = ["s3:GetObject", "s3:PutObject", "s3:DeleteObject",
                  "s3:AbortMultipartUpload", "s3:ListMultipartUploadParts"]
# EC2 may not know a profile for some seconds after IAM made it.
ASSOCIATE_ATTEMPTS = 15
ASSOCIATE_RETRY_S = 2.0


def policy_document(buckets: set[str]) -> dict[str, Any]:
    names = sorted(buckets)
    return {"Version": "2012-10-17", "Statement": [
        {"Sid": "Buckets", "Effect": "Allow", "Action": BUCKET_ACTIONS,
         "Resource": [f"arn:aws:s3:::{b}" for b in names]},
        {"Sid": "Objects", "Effect": "Allow", "Action": OBJECT_ACTIONS,
         "Resource": [f"arn:aws:s3:::{b}/*" for b in names]},
    ]}


def granted_buckets(document: dict[str, Any] | str | None) -> set[str]:
    """The buckets a policy made by policy_document grants (IAM may hand the document back
    URL-encoded or parsed)."""
    if not document:
        return set()
    parsed: dict[str, Any] = json.loads(unquote(document)) if isinstance(document, str) \
        else document
    found: set[str] = set()
    for statement in parsed.get("Statement", []):
        if statement.get("Sid") != "Buckets":
            continue
        resources = statement.get("Resource", [])
        for arn in [resources] if isinstance(resources, str) else resources:
            found.add(str(arn).removeprefix("arn:aws:s3:::"))
    return found


class InstanceProfiles:
    def __init__(self, api: EC2Api) -> None:
        self._api = api
        self._lock = anyio.Lock()  # one read-modify-write of the policy at a time

    async def _iam(self, operation: str, **params: Any) -> dict[str, Any] | None:
        """One IAM call; None if what it names does not exist."""
        try:
            return await self._api.call(IAM_REGION, operation, service="iam", **params)
        except ProvisionError as exc:
            if exc.message.startswith("NoSuchEntity"):
                return None
            raise ProvisionError(f"cannot set up the nodes' access to S3: {exc.message}",
                                 BlockScope.FATAL,
                                 "clusterd needs IAM rights to make role and instance profile "
                                 f"{ROLE} (iam:CreateRole, iam:PutRolePolicy, "
                                 "iam:CreateInstanceProfile, iam:AddRoleToInstanceProfile, "
                                 "iam:PassRole)") from None

    async def ensure(self, buckets: tuple[str, ...]) -> str:
        """The profile's ARN, once its role grants every bucket in `buckets`."""
        async with self._lock:
            if await self._iam("GetRole", RoleName=ROLE) is None:
                logger.info("making the nodes' IAM role", role=ROLE)
                await self._iam("CreateRole", RoleName=ROLE,
                                AssumeRolePolicyDocument=json.dumps(TRUST),
                                Description="clusterd nodes: the S3 buckets their tasks mount")
            current = await self._iam("GetRolePolicy", RoleName=ROLE, PolicyName=POLICY)
            granted = granted_buckets((current or {}).get("PolicyDocument"))
            if not set(buckets) <= granted:
                document = json.dumps(policy_document(granted | set(buckets)))
                if len(document) > POLICY_LIMIT:
                    raise ProvisionError(
                        f"role {ROLE} would grant more buckets than one IAM policy can hold",
                        BlockScope.FATAL,
                        f"remove buckets no cluster uses from its policy {POLICY}")
                await self._iam("PutRolePolicy", RoleName=ROLE, PolicyName=POLICY,
                                PolicyDocument=document)
                logger.info("the nodes' role grants buckets", buckets=sorted(set(buckets)))
            found = await self._iam("GetInstanceProfile", InstanceProfileName=ROLE)
            if found is None:
                found = await self._iam("CreateInstanceProfile", InstanceProfileName=ROLE)
            assert found is not None
            profile = found["InstanceProfile"]
            if not any(r.get("RoleName") == ROLE for r in profile.get("Roles", [])):
                await self._iam("AddRoleToInstanceProfile", InstanceProfileName=ROLE,
                                RoleName=ROLE)
            return str(profile["Arn"])

    async def associate(self, region: str, instance_ids: list[str], arn: str) -> None:
        """Every instance holds the profile (an instance holding another is left alone: the
        user gave it that)."""
        answer = await self._api.call(region, "DescribeIamInstanceProfileAssociations",
                                      Filters=[{"Name": "instance-id", "Values": instance_ids},
                                               {"Name": "state",
                                                "Values": ["associating", "associated"]}])
        held = {a["InstanceId"] for a in answer.get("IamInstanceProfileAssociations", [])}
        for instance in instance_ids:
            if instance not in held:
                await self._associate_one(region, instance, arn)

    async def _associate_one(self, region: str, instance: str, arn: str) -> None:
        for attempt in range(ASSOCIATE_ATTEMPTS):
            try:
                await self._api.call(region, "AssociateIamInstanceProfile",
                                     InstanceId=instance, IamInstanceProfile={"Arn": arn})
                return
            except ProvisionError as exc:
                # A profile IAM has just made is not yet known to EC2 everywhere.
                if "InvalidParameterValue" not in exc.message \
                        or attempt == ASSOCIATE_ATTEMPTS - 1:
                    raise
            await anyio.sleep(ASSOCIATE_RETRY_S)

