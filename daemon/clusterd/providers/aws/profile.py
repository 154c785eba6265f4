"""The instance profile that lets a cluster's nodes use the S3 buckets its tasks mount, so no
credentials of the user's ever reach a cloud VM.

One role and one instance profile per daemon, both named by its id (`role_name`), so that two
daemons sharing an account never share or overwrite each other's grants. The role holds one
inline policy per cluster of this daemon that mounts buckets (`cluster_policy_name`), granting
exactly the buckets that cluster's tasks named (listing, and reading and writing objects). The
role thus grants the buckets this daemon's clusters use now: a cluster's policy goes when the
cluster does (`release`), and a bucket with it unless another cluster's policy names it too.
Each policy is written whole by the one daemon that owns the role, under a lock. The nodes get
the role's temporary credentials from the instance metadata service, as every AWS SDK
(botocore, rclone) finds them, with no file on the node.

A role `clusterd-node` made by an older clusterd (shared by every daemon of the account) is
left alone: it is not provably this daemon's alone (README says how to remove it).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote

import anyio

from clusterd import log
from clusterd.providers.aws.ec2 import EC2Api
from clusterd.providers.base import BlockScope, ProvisionError

logger = log.get("clusterd.aws")

ROLE_SUFFIX = "-node"
POLICY_PREFIX = "buckets-"
IAM_REGION = "us-east-1"  # IAM is global; its endpoint answers from here
# IAM's quotas: a role name holds 64 characters, a policy name 128, and a role's inline
# policies together 10,240.
ROLE_NAME_LIMIT = 64
POLICY_NAME_LIMIT = 128
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
NOT_IAM_NAME = re.compile(r"[^\w+=,.@-]")


def role_name(daemon_id: str) -> str:
    """The role (and instance profile) of this daemon's nodes: `<daemon id>-node`."""
    stem = NOT_IAM_NAME.sub("-", daemon_id)[:ROLE_NAME_LIMIT - len(ROLE_SUFFIX)]
    return stem + ROLE_SUFFIX


def cluster_policy_name(cloud_name: str) -> str:
    """The role's inline policy granting one cluster's buckets."""
    return (POLICY_PREFIX + NOT_IAM_NAME.sub("-", cloud_name))[:POLICY_NAME_LIMIT]


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
    def __init__(self, api: EC2Api, daemon_id: str) -> None:
        self._api = api
        self.role = role_name(daemon_id)
        self._daemon_id = daemon_id
        self._lock = anyio.Lock()  # one read-modify-write of a cluster's policy at a time

    async def _iam(self, operation: str, **params: Any) -> dict[str, Any] | None:
        """One IAM call; None if what it names does not exist."""
        try:
            return await self._api.call(IAM_REGION, operation, service="iam", **params)
        except ProvisionError as exc:
            if exc.message.startswith("NoSuchEntity"):
                return None
            raise ProvisionError(f"the nodes' access to S3: IAM {operation} on {self.role} "
                                 f"failed: {exc.message}",
                                 BlockScope.FATAL,
                                 "give clusterd's credentials the rights in "
                                 f"docs/aws-iam-policy.json (iam:{operation} on {self.role} "
                                 "among them)") from None

    async def ensure(self, cloud_name: str, buckets: tuple[str, ...]) -> str:
        """The profile's ARN, once the role grants every bucket in `buckets` to the cluster
        (added to what it already grants that cluster: its running jobs may use those)."""
        async with self._lock:
            if await self._iam("GetRole", RoleName=self.role) is None:
                logger.info("making the nodes' IAM role", role=self.role)
                await self._iam("CreateRole", RoleName=self.role,
                                AssumeRolePolicyDocument=json.dumps(TRUST),
                                Description=f"clusterd {self._daemon_id}: the S3 buckets its "
                                "clusters' tasks mount")
            name = cluster_policy_name(cloud_name)
            current = await self._iam("GetRolePolicy", RoleName=self.role, PolicyName=name)
            granted = granted_buckets((current or {}).get("PolicyDocument"))
            if current is None or not set(buckets) <= granted:
                document = json.dumps(policy_document(granted | set(buckets)))
                if len(document) > POLICY_LIMIT:
                    raise ProvisionError(
                        f"role {self.role} would grant cluster {cloud_name} more buckets "
                        "than one IAM policy can hold", BlockScope.FATAL,
                        "mount fewer buckets on one cluster")
                await self._iam("PutRolePolicy", RoleName=self.role, PolicyName=name,
                                PolicyDocument=document)
                logger.info("the nodes' role grants buckets", role=self.role,
                            cluster=cloud_name, buckets=sorted(granted | set(buckets)))
            found = await self._iam("GetInstanceProfile", InstanceProfileName=self.role)
            if found is None:
                found = await self._iam("CreateInstanceProfile", InstanceProfileName=self.role)
            assert found is not None
            profile = found["InstanceProfile"]
            if not any(r.get("RoleName") == self.role for r in profile.get("Roles", [])):
                await self._iam("AddRoleToInstanceProfile", InstanceProfileName=self.role,
                                RoleName=self.role)
            return str(profile["Arn"])

    async def release(self, cloud_name: str) -> None:
        """The cluster is gone: the role no longer grants its buckets (those another cluster
        of this daemon still uses stay, in that cluster's policy). Idempotent."""
        async with self._lock:
            try:
                await self._iam("DeleteRolePolicy", RoleName=self.role,
                                PolicyName=cluster_policy_name(cloud_name))
            except ProvisionError as exc:
                if "AccessDenied" not in exc.message:
                    raise
                # Credentials without IAM rights (those of most users who mount no
                # bucket) must not make every teardown fail; the warning names what stays.
                logger.warning("cannot remove a cluster's bucket grant", role=self.role,
                               cluster=cloud_name, error=exc.message)

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

