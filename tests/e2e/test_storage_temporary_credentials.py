"""Temporary AWS credentials (an assumed role with a short DurationSeconds, from the EC2 test
bed's STS) sent to a non-AWS node for a bucket: the launch says they are temporary and when
they expire, since the copy on the node is not refreshed."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.e2e.test_storage import s3
from tests.support import Daemon

pytestmark = [pytest.mark.ec2, pytest.mark.ray]


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    # The bed's own config, plus a profile assuming a role for 15 minutes (as an SSO or a
    # role profile gives): botocore gets its credentials from the bed's STS.
    config = Path(ec2.env["AWS_CONFIG_FILE"]).read_text() + (
        "\n[profile short]\nregion = us-east-1\nsource_profile = default\n"
        "role_arn = arn:aws:iam::123456789012:role/clusterd-short\nduration_seconds = 900\n")
    path = ec2.dir / f"short-{os.getpid()}.config"
    path.write_text(config)
    with running(ec2.daemon("cdtc-", AWS_CONFIG_FILE=str(path), AWS_PROFILE="short")) as found:
        yield found


def test_the_launch_says_when_the_nodes_credentials_expire(ec2: EC2Bed,
                                                           daemon: Daemon) -> None:
    bucket = f"tc-{uuid.uuid4().hex[:8]}"
    s3(ec2, f"s3.create_bucket(Bucket={bucket!r}); "
            f"s3.put_object(Bucket={bucket!r}, Key='d/a.txt', Body=b'hello')")
    dest = daemon.root / "mnt" / "data"
    task = daemon.root / "copy.yaml"
    task.write_text(f"file_mounts:\n  {dest}: s3://{bucket}/d\nrun: cat {dest}/a.txt\n")
    result = daemon.ctl("launch", "-c", "temp", "--infra", "local", str(task), timeout=600)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "hello" in result.stdout
        (line,) = [x for x in result.stderr.splitlines() if "are temporary" in x]
        assert "warning: the AWS credentials sent to 1 node for buckets are temporary " \
               "(assume-role) and expire at " in line
        assert "(in 15 min)" in line or "(in 14 min)" in line
    finally:
        assert daemon.ctl("down", "-y", "temp").returncode == 0
