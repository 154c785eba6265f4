"""clusterd on an EC2 test bed that enforces IAM and account boundaries (`ec2 up --iam`): the
daemon holds exactly README's policy (docs/aws-iam-policy.json) and nothing more, and still
launches, copies and mounts buckets, execs, stops and tears down; a node's role reaches only
the buckets its policy names; another account's bucket is refused, and said so."""

from __future__ import annotations

import json
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, ec2_bed, running
from tests.support import Daemon

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(1800)]

OTHER_ACCOUNT_BUCKET = "testbed-other-account"  # the bed's (scripts/_testbed/ec2/accounts.py)
S3 = """
import boto3, json
s3 = boto3.client("s3", region_name="us-east-1")
iam = boto3.client("iam", region_name="us-east-1")
"""
# Run on a node: list a bucket with the node's own credentials (the instance profile's, from
# the metadata service), as a MOUNT's rclone does.
# (Provider Other: path-style requests, as the bed's one endpoint needs; as bucket_mount.py.)
LIST = ("said=$(rclone lsf --s3-provider Other --s3-env-auth --s3-region us-east-1 "
        "--retries 1 --low-level-retries 1 --s3-endpoint {endpoint} :s3:{bucket} 2>&1); "
        "echo \"{tag} exit $? $said\"")


@pytest.fixture(scope="module")
def ec2() -> Iterator[EC2Bed]:
    with ec2_bed(iam=True) as bed:
        yield bed


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdiam-")) as found:
        yield found


def as_admin(ec2: EC2Bed, code: str) -> Any:
    """boto3 code in the bed with keys allowed everything; what it prints as JSON."""
    out = ec2.python(S3 + code, admin=True)
    return json.loads(out) if out.strip() else None


def test_the_readme_policy_is_all_clusterd_needs_and_nodes_get_only_their_buckets(
        ec2: EC2Bed, daemon: Daemon) -> None:
    data, secret, ckpt = (f"{stem}-{uuid.uuid4().hex[:8]}" for stem in ("data", "secret",
                                                                        "ckpt"))
    as_admin(ec2, f"""
for bucket in ({data!r}, {secret!r}):
    s3.create_bucket(Bucket=bucket)
    s3.put_object(Bucket=bucket, Key="d/hello.txt", Body=b"hello from " + bucket.encode())
""")
    endpoint = ec2.env["AWS_ENDPOINT_URL_S3"]
    task = daemon.root / "iam.yaml"
    task.write_text(
        "resources:\n  cpus: 2\n"
        f"file_mounts:\n  ~/data: s3://{data}/d\n"
        f"  /home/ubuntu/ckpt:\n    name: {ckpt}\n    mode: MOUNT\n    persistent: false\n"
        "run: |\n"
        "  cat ~/data/hello.txt; echo\n"
        "  echo written > ~/ckpt/out.txt\n"
        f"  {LIST.format(endpoint=endpoint, bucket=secret, tag='SECRET')}\n"
        f"  {LIST.format(endpoint=endpoint, bucket=data, tag='DATA')}\n")
    launched = daemon.ctl("launch", "-c", "iam", "--infra", "aws/us-east-1", str(task),
                          timeout=1200)
    try:
        assert launched.returncode == 0, launched.stderr + daemon.log()[-4000:]
        out = launched.stdout
        assert f"hello from {data}" in out, out
        assert "DATA exit 0" in out, out
        # The node's role does not name this bucket of the same account: refused.
        assert "SECRET exit 0" not in out and "SECRET exit" in out, out
        assert "AccessDenied" in out or "403" in out, out
        assert as_admin(ec2, f"print(json.dumps([o['Key'] for o in s3.list_objects_v2("
                             f"Bucket={ckpt!r}).get('Contents', [])]))") == ["out.txt"]
        executed = daemon.ctl("exec", "iam", "--", "echo exec-ok", timeout=300)
        assert executed.returncode == 0 and "exec-ok" in executed.stdout, executed.stderr
        stopped = daemon.ctl("stop", "-y", "iam", timeout=600)
        assert stopped.returncode == 0, stopped.stderr
        assert (daemon.cluster("iam") or {}).get("status") == "STOPPED"
    finally:
        down = daemon.ctl("down", "-y", "iam", timeout=600)
    assert down.returncode == 0, down.stderr + daemon.log()[-4000:]
    managed_by = (daemon.state_dir / "daemon-id").read_text().strip()
    # The cluster's grant went with it: the role grants nothing now.
    assert as_admin(ec2, f"print(json.dumps(iam.list_role_policies("
                         f"RoleName={managed_by + '-node'!r})['PolicyNames']))") == []


def test_another_accounts_bucket_is_refused_and_said_so(ec2: EC2Bed, daemon: Daemon) -> None:
    task = daemon.root / "theirs.yaml"
    task.write_text("resources:\n  cpus: 2\n"
                    f"file_mounts:\n  ~/theirs: s3://{OTHER_ACCOUNT_BUCKET}\n"
                    "run: ls ~/theirs\n")
    launched = daemon.ctl("launch", "-c", "theirs", "--infra", "aws/us-east-1", str(task),
                          timeout=600)
    try:
        assert launched.returncode != 0
        assert OTHER_ACCOUNT_BUCKET in launched.stderr, launched.stderr
        assert "another AWS account" in launched.stderr, launched.stderr
        # Buckets are checked before any node is made.
        assert not [i for i in ec2.aws()["instances"]
                    if i["tags"].get("clusterd-cluster") == "theirs"], ec2.aws()
    finally:
        daemon.ctl("down", "-y", "theirs", timeout=600)
