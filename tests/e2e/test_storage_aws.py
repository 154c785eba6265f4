"""Buckets on aws clusters, end to end in the EC2 test bed: the nodes use S3 through the
instance profile clusterd makes (IAM in moto), their credentials served by the bed's instance
metadata service (IMDSv2) as EC2 serves them: no credentials file of the user's ever reaches
a node. A managed job preempted mid-run resumes from the checkpoint in its mounted bucket."""

from __future__ import annotations

import json
import os
import re
import textwrap
import uuid
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed
from tests.e2e.test_managed_jobs import (
    FINAL,
    instances_of,
    live,
    log_of,
    managed_jobs_daemon,
    on_runtime_image,
    submit,
    wait_status,
)
from tests.e2e.test_storage import digest, s3
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(1500)]

# Run on a node: what its metadata service says, with IMDSv1 (no token) refused.
WHOAMI = r"""
import json, urllib.request, urllib.error
base = "http://169.254.169.254/latest"
try:
    urllib.request.urlopen(base + "/meta-data/instance-id", timeout=2)
    v1 = "answered"
except urllib.error.HTTPError as e:
    v1 = e.code
token = urllib.request.urlopen(urllib.request.Request(
    base + "/api/token", method="PUT",
    headers={"X-aws-ec2-metadata-token-ttl-seconds": "60"}), timeout=2).read().decode()
def get(path):
    return urllib.request.urlopen(urllib.request.Request(
        base + path, headers={"X-aws-ec2-metadata-token": token}), timeout=2).read().decode()
role = get("/meta-data/iam/security-credentials/")
keys = json.loads(get("/meta-data/iam/security-credentials/" + role))
print("WHOAMI " + json.dumps({"v1": v1, "instance": get("/meta-data/instance-id"),
                              "role": role, "code": keys["Code"],
                              "temporary": bool(keys["Token"] and keys["Expiration"])}))
"""


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with managed_jobs_daemon(ec2, "cdsa-") as daemon:
        yield daemon


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def bucket_keys(ec2: EC2Bed, bucket: str) -> list[str] | None:
    """The bucket's keys; None if it does not exist."""
    found: list[str] | None = s3(ec2, f"""
try:
    pages = s3.get_paginator("list_objects_v2").paginate(Bucket={bucket!r})
    print(json.dumps(sorted(o["Key"] for p in pages for o in p.get("Contents", []))))
except s3.exceptions.NoSuchBucket:
    print("null")
""")
    return found


def test_a_two_node_aws_cluster_copies_and_mounts_through_its_instance_profile(
        ec2: EC2Bed, daemon: Daemon, tmp_path: Any) -> None:
    data, ckpt = unique("ds"), unique("ckpt")
    big = tmp_path / "big.bin"
    big.write_bytes(os.urandom(200 * 1024 * 1024 + 7))
    s3(ec2, f"""
s3.create_bucket(Bucket={data!r})
from concurrent.futures import ThreadPoolExecutor
def put(i):
    s3.put_object(Bucket={data!r}, Key=f"ds/small/{{i:04d}}.txt", Body=f"object {{i}}\\n".encode())
with ThreadPoolExecutor(16) as pool:
    list(pool.map(put, range(1000)))
s3.upload_file({str(big)!r}, {data!r}, "ds/big.bin")
""")
    task = daemon.root / "aws-buckets.yaml"
    task.write_text(on_runtime_image(daemon, (
        "num_nodes: 2\nresources:\n  cpus: 2\n"
        f"file_mounts:\n  ~/data: s3://{data}/ds\n"
        f"  /home/ubuntu/ckpt:\n    name: {ckpt}\n    mode: MOUNT\n    persistent: false\n"
        "run: |\n"
        "  echo \"files $(find ~/data -type f | wc -l)\"\n"
        "  sha256sum ~/data/big.bin\n"
        "  echo \"credential files $(find ~ -path '*aws/credentials' | wc -l)\"\n"
        "  echo \"rank $SKYPILOT_NODE_RANK\" > ~/ckpt/rank-$SKYPILOT_NODE_RANK.txt\n"
        f"  python3 - <<'EOF'\n{textwrap.indent(WHOAMI, '  ')}  EOF\n")))
    launched = daemon.ctl("launch", "-c", "profiled", "--infra", "aws/us-east-1", str(task),
                          timeout=900)
    try:
        assert launched.returncode == 0, launched.stderr + daemon.log()[-4000:]
        assert f"the nodes' instance profile grants {ckpt}, {data}" in launched.stderr \
            or f"the nodes' instance profile grants {data}, {ckpt}" in launched.stderr, \
            launched.stderr
        out = launched.stdout
        # Byte-identical on both nodes: every object, and the big one's digest twice.
        assert out.count("files 1001") == 2, out
        assert out.count(digest(big)) == 2, out
        assert out.count("credential files 0") == 2, out
        who = [json.loads(line.split("WHOAMI ", 1)[1]) for line in out.splitlines()
               if "WHOAMI " in line]
        nodes = {i["id"] for i in live(instances_of(ec2, "profiled"))}
        assert {w["instance"] for w in who} == nodes and len(nodes) == 2, (who, nodes)
        role = (daemon.state_dir / "daemon-id").read_text().strip() + "-node"
        assert all(w["v1"] == 401 and w["role"] == role and
                   w["code"] == "Success" and w["temporary"] for w in who), who
        assert bucket_keys(ec2, ckpt) == ["rank-0.txt", "rank-1.txt"]
    finally:
        down = daemon.ctl("down", "-y", "profiled", timeout=600)
    assert down.returncode == 0, down.stderr
    assert bucket_keys(ec2, ckpt) is None  # persistent: false, made by clusterd
    assert bucket_keys(ec2, data) is not None  # not clusterd's


RESUMING = """
resources:
  cpus: 2
  use_spot: true
file_mounts:
  /home/ubuntu/ckpt:
    name: {bucket}
    mode: MOUNT
    persistent: false
run: |
  step=$(cat ~/ckpt/step 2>/dev/null || echo 0)
  echo "attempt $SKYPILOT_MANAGED_JOB_ATTEMPT resumed from step $step"
  pause=0.2; [ "$SKYPILOT_MANAGED_JOB_ATTEMPT" = 1 ] && pause=3
  for i in $(seq $((step + 1)) 40); do
    echo $i > ~/ckpt/step
    echo "step $i"
    sleep $pause
  done
  echo done
"""


def test_a_preempted_managed_job_resumes_from_the_checkpoint_in_its_bucket(
        ec2: EC2Bed, daemon: Daemon) -> None:
    bucket = unique("mjckpt")
    job_id = submit(daemon, RESUMING.format(bucket=bucket), "resumer")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 900)
    assert running_now["status"] == "RUNNING", running_now
    wait_for(lambda: "step 6\n" in log_of(daemon, job_id), 300, "step 6 of attempt 1",
             interval=1)
    (first,) = live(instances_of(ec2, running_now["cluster"]))
    assert ec2.testbed("preempt", first["id"]).returncode == 0
    done = wait_status(daemon, job_id, FINAL, 900)
    text = log_of(daemon, job_id)
    assert done["status"] == "SUCCEEDED" and done["recoveries"] == 1, (done, text)
    resumed = re.search(r"attempt 2 resumed from step (\d+)", text)
    assert resumed and int(resumed.group(1)) >= 6, text
    last_of_first = max(int(n) for n in re.findall(
        r"^step (\d+)$", text.split("attempt 2 resumed")[0], re.M))
    # Every step a preempted node printed was written to the bucket before it went.
    assert int(resumed.group(1)) >= last_of_first - 1, text
    assert text.rstrip().endswith("done"), text
    # The bucket lived through the lost cluster's teardown, and goes with the job.
    assert bucket_keys(ec2, bucket) is None


def test_a_node_that_replaced_a_lost_one_gets_the_mounts_with_the_next_launch(
        ec2: EC2Bed, daemon: Daemon) -> None:
    bucket = unique("shared")
    s3(ec2, f"s3.create_bucket(Bucket={bucket!r}); "
            f"s3.put_object(Bucket={bucket!r}, Key='marker', Body=b'marker-ok')")
    task = daemon.root / "replaced.yaml"
    task.write_text(on_runtime_image(daemon, (
        "num_nodes: 2\nresources:\n  cpus: 2\n"
        f"file_mounts:\n  /home/ubuntu/shared:\n    source: s3://{bucket}\n    mode: MOUNT\n"
        "run: echo \"rank $SKYPILOT_NODE_RANK on $(hostname -I | cut -d' ' -f1) "
        "reads $(cat ~/shared/marker)\"\n")))
    first = daemon.ctl("launch", "-c", "replaced", "--infra", "aws/us-east-1", str(task),
                       timeout=900)
    try:
        assert first.returncode == 0, first.stderr + daemon.log()[-3000:]
        assert first.stdout.count("reads marker-ok") == 2, first.stdout
        worker = next(i for i in live(instances_of(ec2, "replaced"))
                      if i["tags"]["clusterd-node-role"] == "worker")
        ec2.python("import boto3; boto3.client('ec2', region_name='us-east-1')"
                   f".terminate_instances(InstanceIds=[{worker['id']!r}])")
        wait_for(lambda: worker["id"] not in {i["id"] for i in live(
            instances_of(ec2, "replaced"))}, 120, "the worker to be gone")
        # The launch that makes the lost node again mounts the bucket there too (the new
        # instance gets the profile as well).
        again = daemon.ctl("launch", "-c", "replaced", str(task), timeout=900)
        assert again.returncode == 0, again.stderr + daemon.log()[-3000:]
        assert "making them again" in again.stderr, again.stderr
        assert again.stdout.count("reads marker-ok") == 2, again.stdout
        assert len(live(instances_of(ec2, "replaced"))) == 2
    finally:
        assert daemon.ctl("down", "-y", "replaced", timeout=600).returncode == 0
    assert bucket_keys(ec2, bucket) == ["marker"]  # not clusterd's: untouched
