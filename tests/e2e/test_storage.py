"""Buckets in `file_mounts`, end to end through clusterctl: a daemon in the EC2 test bed's
namespace, whose moto serves S3 too, and a `local` cluster (this machine, in that namespace),
which gets the daemon's AWS credentials in a file of its own."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.support import Daemon

pytestmark = [pytest.mark.ec2, pytest.mark.ray]

S3 = """
import boto3, json, sys
s3 = boto3.client("s3", region_name="us-east-1")
"""


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdst-")) as found:
        yield found


def s3(ec2: EC2Bed, code: str) -> Any:
    """Run boto3 code in the bed (its `s3` client ready); what it prints as JSON."""
    out = ec2.python(S3 + code)
    return json.loads(out) if out.strip() else None


def bucket_exists(ec2: EC2Bed, name: str) -> bool:
    found: bool = s3(ec2, f"print(json.dumps({name!r} in [b['Name'] for b in "
                          "s3.list_buckets()['Buckets']]))")
    return found


def mounted(daemon: Daemon, path: Path) -> bool:
    """Whether path is a mount point where the daemon (and its local cluster) live: `ip netns
    exec` gave them a mount namespace of their own, so this process cannot see it."""
    assert daemon.process is not None
    done = subprocess.run(["nsenter", "-t", str(daemon.process.pid), "-m", "--",
                           "mountpoint", "-q", str(path)], timeout=30)
    return done.returncode == 0


def unique(stem: str) -> str:
    return f"{stem}-{uuid.uuid4().hex[:8]}"


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_copy_of_a_prefix_is_byte_identical_on_the_node(ec2: EC2Bed, daemon: Daemon) -> None:
    bucket = unique("ds")
    big = daemon.root / "big.bin"
    big.write_bytes(os.urandom(40 * 1024 * 1024 + 5))
    s3(ec2, f"""
s3.create_bucket(Bucket={bucket!r})
for i in range(1000):
    s3.put_object(Bucket={bucket!r}, Key=f"ds/small/{{i:04d}}.txt",
                  Body=f"object {{i}}\\n".encode())
s3.upload_file({str(big)!r}, {bucket!r}, "ds/big.bin")
s3.put_object(Bucket={bucket!r}, Key="other/x", Body=b"not under the prefix")
""")
    dest = daemon.root / "mnt" / "data"
    task = daemon.root / "copy.yaml"
    task.write_text(f"file_mounts:\n  {dest}: s3://{bucket}/ds\n"
                    f"run: |\n  find {dest} -type f | wc -l\n  sha256sum {dest}/big.bin\n")
    result = daemon.ctl("launch", "-c", "copier", "--infra", "local", str(task), timeout=600)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "copying 1 bucket mount(s) to 1 node(s)" in result.stderr
        assert "1001" in result.stdout
        assert digest(dest / "big.bin") in result.stdout
        assert digest(dest / "big.bin") == digest(big)
        assert (dest / "small" / "0999.txt").read_text() == "object 999\n"
        assert not (dest / "x").exists() and not list(dest.rglob(".*clusterd-partial"))
        # The node's credentials file is the cluster's only, private, and goes with it.
        (credentials,) = daemon.root.rglob("aws/credentials")
        assert credentials.stat().st_mode & 0o777 == 0o600
    finally:
        down = daemon.ctl("down", "-y", "copier")
    assert down.returncode == 0, down.stderr
    assert not credentials.exists()
    assert bucket_exists(ec2, bucket)  # never clusterd's to delete


def test_a_bucket_clusterd_makes_is_listed_and_goes_with_its_cluster_when_not_persistent(
        ec2: EC2Bed, daemon: Daemon) -> None:
    made, kept, before = unique("made"), unique("kept"), unique("before")
    s3(ec2, f"s3.create_bucket(Bucket={before!r})")
    source = daemon.root / "up"
    (source / "sub").mkdir(parents=True)
    (source / "sub" / "f.txt").write_text("uploaded\n")
    task = daemon.root / "made.yaml"
    task.write_text(
        "file_mounts:\n"
        f"  {daemon.root}/m1:\n    name: {made}\n    source: {source}\n    mode: COPY\n"
        "    persistent: false\n"
        f"  {daemon.root}/m2:\n    name: {kept}\n    mode: COPY\n"
        f"  {daemon.root}/m3:\n    name: {before}\n    mode: COPY\n    persistent: false\n"
        f"run: cat {daemon.root}/m1/sub/f.txt\n")
    result = daemon.ctl("launch", "-c", "maker", "--infra", "local", str(task), timeout=600)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "uploaded" in result.stdout
        assert f"creating bucket {made} in us-east-1" in result.stderr
        # Made ready once per launch, not again when the job is submitted.
        assert result.stderr.count(f"uploading {source} to ") == 1, result.stderr
        listed = {b["name"]: b for b in json.loads(daemon.ctl("storage", "ls", "--json").stdout)}
        assert set(listed) >= {made, kept} and before not in listed
        assert listed[made]["clusters"] == ["maker"] and listed[made]["objects"] == 1
        assert listed[made]["persistent"] is False and listed[kept]["persistent"] is True
        refused = daemon.ctl("storage", "delete", made)
        assert refused.returncode == 1 and "used by maker" in refused.stderr
        foreign = daemon.ctl("storage", "delete", before)
        assert foreign.returncode == 1 and "not made by clusterd" in foreign.stderr
    finally:
        down = daemon.ctl("down", "-y", "maker")
    assert down.returncode == 0, down.stderr
    assert not bucket_exists(ec2, made)  # made for it, not persistent: gone with it
    assert bucket_exists(ec2, kept) and bucket_exists(ec2, before)
    assert daemon.ctl("storage", "delete", kept).returncode == 0
    assert not bucket_exists(ec2, kept)
    assert kept not in daemon.ctl("storage", "ls").stdout


@pytest.mark.parametrize(("entry", "says"), [
    ("s3://absent-{u}/x", "file_mounts.{d}: bucket absent-{u} does not exist"),
    ("{{name: b-{u}, mode: SYNC}}", "file_mounts.{d}.mode: 'SYNC' is not a mode"),
    ("{{name: b-{u}, store: gcs}}", "'gcs' is not offered: only S3"),
    ("gs://b-{u}/x", "gs:// is not offered: only S3"),
])
def test_a_bad_entry_is_refused_naming_it_and_nothing_is_made(
        ec2: EC2Bed, daemon: Daemon, entry: str, says: str) -> None:
    u = uuid.uuid4().hex[:8]
    dest = f"{daemon.root}/bad"
    task = daemon.root / "bad.yaml"
    task.write_text(f"file_mounts:\n  {dest}: {entry.format(u=u)}\nrun: echo ran\n")
    result = daemon.ctl("launch", "-c", "bad", "--infra", "local", str(task), timeout=300)
    assert result.returncode == 1, result.stdout
    assert says.format(u=u, d=dest) in result.stderr, result.stderr
    assert daemon.cluster("bad") is None
    assert not bucket_exists(ec2, f"b-{u}")


def test_a_checkpoint_in_a_mounted_bucket_outlives_its_cluster(ec2: EC2Bed,
                                                               daemon: Daemon) -> None:
    bucket = unique("ckpt")
    mnt = daemon.root / "ckpt"
    entry = f"file_mounts:\n  {mnt}:\n    name: {bucket}\n    mode: MOUNT\n"
    writer = daemon.root / "write.yaml"
    writer.write_text(entry + "run: |\n"
                      f"  echo step-7 > {mnt}/state.txt\n"
                      f"  head -c 8000000 /dev/urandom > {mnt}/weights.bin\n"
                      f"  sha256sum {mnt}/weights.bin\n")
    first = daemon.ctl("launch", "-c", "trainer", "--infra", "local", str(writer), timeout=600)
    try:
        assert first.returncode == 0, first.stderr + daemon.log()[-3000:]
        assert "mounting 1 bucket(s) on 1 node(s)" in first.stderr
        written = first.stdout.split()[-2]
        assert mounted(daemon, mnt)
    finally:
        assert daemon.ctl("down", "-y", "trainer").returncode == 0
    assert not mounted(daemon, mnt)
    stored = s3(ec2, f"print(json.dumps(sorted(o['Key'] for o in s3.list_objects_v2("
                     f"Bucket={bucket!r})['Contents'])))")
    assert stored == ["state.txt", "weights.bin"]
    reader = daemon.root / "read.yaml"
    reader.write_text(entry + f"run: cat {mnt}/state.txt; sha256sum {mnt}/weights.bin\n")
    second = daemon.ctl("launch", "-c", "resumer", "--infra", "local", str(reader),
                        timeout=600)
    try:
        assert second.returncode == 0, second.stderr
        assert "step-7" in second.stdout and written in second.stdout
        # Stopped, the node's mount goes; started, it comes back.
        assert daemon.ctl("stop", "resumer").returncode == 0
        assert not mounted(daemon, mnt)
        assert daemon.ctl("start", "resumer", timeout=600).returncode == 0
        assert mounted(daemon, mnt)
        again = daemon.ctl("exec", "resumer", "--", f"cat {mnt}/state.txt")
        assert again.returncode == 0 and "step-7" in again.stdout, again.stderr
    finally:
        assert daemon.ctl("down", "-y", "resumer").returncode == 0
    assert daemon.ctl("storage", "delete", bucket).returncode == 0


def test_a_node_made_again_gets_the_clusters_bucket_mounts_on_start(ec2: EC2Bed,
                                                                     daemon: Daemon) -> None:
    bucket = unique("again")
    s3(ec2, f"s3.create_bucket(Bucket={bucket!r}); "
            f"s3.put_object(Bucket={bucket!r}, Key='data/seed.txt', Body=b'seeded')")
    mnt = daemon.root / "again"
    task = daemon.root / "again.yaml"
    task.write_text(f"file_mounts:\n  {mnt}:\n    source: s3://{bucket}/data\n"
                    "    mode: MOUNT\nrun: echo mounted\n")
    launched = daemon.ctl("launch", "-c", "remade", "--infra", "local", str(task), timeout=600)
    try:
        assert launched.returncode == 0, launched.stderr + daemon.log()[-3000:]
        (state,) = daemon.root.rglob("mounts/mounts.json")
        assert daemon.ctl("stop", "remade").returncode == 0
        assert not mounted(daemon, mnt)
        # The node comes back as one made again would: nothing of its mounts on its disk.
        shutil.rmtree(state.parent)
        started = daemon.ctl("start", "remade", timeout=600)
        assert started.returncode == 0, started.stderr + daemon.log()[-3000:]
        assert "mounting 1 bucket(s) on 1 node(s)" in started.stderr
        assert mounted(daemon, mnt)
        seen = daemon.ctl("exec", "remade", "--", f"cat {mnt}/seed.txt")
        assert seen.returncode == 0 and "seeded" in seen.stdout, seen.stderr
    finally:
        assert daemon.ctl("down", "-y", "remade").returncode == 0
    assert not mounted(daemon, mnt)


def test_writes_to_a_cached_mount_are_in_the_bucket_when_the_job_ends(
        ec2: EC2Bed, daemon: Daemon) -> None:
    bucket = unique("cached")
    mnt = daemon.root / "cached"
    task = daemon.root / "cached.yaml"
    task.write_text(f"file_mounts:\n  {mnt}:\n    name: {bucket}\n    mode: MOUNT_CACHED\n"
                    "    persistent: false\n"
                    f"run: for i in $(seq 1 20); do echo $i > {mnt}/out-$i.txt; done\n")
    result = daemon.ctl("launch", "-c", "cacher", "--infra", "local", str(task), timeout=600)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        # The job was reported SUCCEEDED only once its writes were uploaded: all there now.
        stored = s3(ec2, f"print(json.dumps(s3.list_objects_v2(Bucket={bucket!r})"
                         "['KeyCount']))")
        assert stored == 20
    finally:
        assert daemon.ctl("down", "-y", "cacher").returncode == 0
    assert not bucket_exists(ec2, bucket)


def test_a_task_in_skypilots_bucket_shapes_runs_unchanged_but_for_its_names(
        ec2: EC2Bed, daemon: Daemon) -> None:
    """The shapes SkyPilot's storage examples use, in one task: an s3:// COPY, an existing
    bucket mounted by `source`, a checkpoint bucket by `name` from envs, and a local directory
    uploaded to a cached mount with `store: s3`; setup and run both see them."""
    data, run_id = unique("sky-data"), uuid.uuid4().hex[:8]
    s3(ec2, f"""
s3.create_bucket(Bucket={data!r})
s3.put_object(Bucket={data!r}, Key="imagenet-mini/train/0.jpg", Body=b"jpeg 0")
s3.put_object(Bucket={data!r}, Key="imagenet-mini/train/1.jpg", Body=b"jpeg 1")
s3.put_object(Bucket={data!r}, Key="README", Body=b"read-only dataset")
""")
    outputs = daemon.root / "outputs"
    outputs.mkdir()
    (outputs / "seed.txt").write_text("seed 42\n")
    at = daemon.root / "sky"
    task = daemon.root / "sky-storage.yaml"
    task.write_text(f"""name: storage-demo
envs:
  RUN_ID: {run_id}
  DATA_BUCKET: {data}
file_mounts:
  {at}/datasets-s3: s3://{data}/imagenet-mini
  {at}/dataset-ro:
    source: s3://{data}
    mode: MOUNT
  {at}/checkpoint:
    name: sky-ckpt-${{RUN_ID}}
    mode: MOUNT
  {at}/outputs:
    name: sky-out-${{RUN_ID}}
    source: {outputs}
    store: s3
    mode: MOUNT_CACHED
    persistent: false
setup: |
  echo "setup sees $(find {at}/datasets-s3 -type f | wc -l) images"
run: |
  cat {at}/dataset-ro/README; echo
  cat {at}/outputs/seed.txt
  echo "epoch 1" > {at}/checkpoint/last.txt
  echo "loss 0.1" > {at}/outputs/metrics.txt
""")
    result = daemon.ctl("launch", "-c", "skyshapes", str(task), "--infra", "local",
                        timeout=600)
    try:
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "setup sees 2 images" in result.stdout, result.stdout
        assert "read-only dataset" in result.stdout and "seed 42" in result.stdout
        listed = json.loads(daemon.ctl("storage", "ls", "--json").stdout)
        made = {b["name"] for b in listed}
        assert {f"sky-ckpt-{run_id}", f"sky-out-{run_id}"} <= made and data not in made
    finally:
        assert daemon.ctl("down", "-y", "skyshapes").returncode == 0
    keys = s3(ec2, f"print(json.dumps(sorted(o['Key'] for o in s3.list_objects_v2("
                   f"Bucket='sky-ckpt-{run_id}')['Contents'])))")
    assert keys == ["last.txt"]
    assert not bucket_exists(ec2, f"sky-out-{run_id}")  # persistent: false, ours
    assert bucket_exists(ec2, data)
    assert daemon.ctl("storage", "delete", f"sky-ckpt-{run_id}").returncode == 0
