"""Bucket benchmarks on the EC2 test bed (its moto serves S3 through the bed's endpoint), with
a `local` cluster in the bed's namespace, side by side in one run:

- COPY of 1 GB (8 objects of 128 MB) from the bed's S3 to the node, as `clusterctl exec` of
  a task with an `s3://` file mount does it (from its `copying` progress line to the next),
  against `rclone copy` of the same prefix into a fresh directory, right after, in the same
  namespace (Debian's rclone, its default 4 transfers).
- MOUNT: a sequential read of a 500 MB object through a MOUNT of its bucket (`cat` to
  /dev/null in the job, timed by the job), against a COPY of the same object to the node.

Both go through the bed's API endpoint (a Python proxy in front of moto), which bounds what
any client gets; the ratios are what says how clusterd does. Run through
`scripts/bench --only storage`.
"""

from __future__ import annotations

import re
import sys
import tempfile
import time
from typing import Any

from bench_aws import AWSBed
from bench_bed import PROGRESS

COPY_OBJECTS, COPY_MB = 8, 128
MOUNT_MB = 500
MOUNT_READ = re.compile(r"read (\d+) bytes in ([\d.]+) s")

FILL = """
import boto3, os
s3 = boto3.client("s3", region_name="us-east-1")
s3.create_bucket(Bucket="bench-copy")
chunk = os.urandom(1024 * 1024)
for i in range(__OBJECTS__):
    s3.put_object(Bucket="bench-copy", Key=f"ds/part-{i}.bin", Body=chunk * __MB__)
s3.create_bucket(Bucket="bench-mount")
s3.put_object(Bucket="bench-mount", Key="big/object.bin", Body=chunk * __MOUNT_MB__)
"""


def copy_seconds(stderr: str) -> float:
    """From the `copying` progress line to the next one (the copy on the node)."""
    marks = [(float(m.group(1)), m.group(2)) for line in stderr.splitlines()
             if (m := PROGRESS.match(line.strip()))]
    for index, (at, text) in enumerate(marks):
        if text.startswith("copying") and index + 1 < len(marks):
            return marks[index + 1][0] - at
    raise SystemExit(f"no copy in the progress:\n{stderr[-2000:]}")


def bench_storage(bench: Any) -> None:
    print("(s) buckets: COPY of 1 GB vs rclone copy; a MOUNT read of 500 MB vs a COPY of it",
          file=sys.stderr)
    bed = AWSBed(bench)
    try:
        bed.up()
        bed.python(FILL.replace("__OBJECTS__", str(COPY_OBJECTS)).replace(
            "__MB__", str(COPY_MB)).replace("__MOUNT_MB__", str(MOUNT_MB)))
        up = bed.ctl("launch", "-c", "bench-s3", "--infra", "local", "--", "true")
        if up.returncode != 0:
            raise SystemExit(f"local launch failed: {up.stderr}")
        scratch = tempfile.mkdtemp(prefix="cdbs3-", dir=bed.root)
        copy_task = bed.root / "copy.yaml"
        copy_task.write_text(f"file_mounts:\n  {scratch}/copied: s3://bench-copy/ds\n"
                             "run: echo copied\n")
        done = bed.ctl("exec", "bench-s3", str(copy_task))
        if done.returncode != 0:
            raise SystemExit(f"COPY exec failed: {done.stderr}")
        ours = copy_seconds(done.stderr)
        started = time.monotonic()
        bed.run("env", "-u", "AWS_CA_BUNDLE", "RCLONE_CONFIG=/dev/null",
                "RCLONE_S3_PROVIDER=Other", "RCLONE_S3_ENV_AUTH=true",
                f"RCLONE_S3_ENDPOINT={bed.env['AWS_ENDPOINT_URL_S3']}",
                "RCLONE_S3_REGION=us-east-1", "rclone", "copy", ":s3:bench-copy/ds",
                f"{scratch}/rclone", timeout=1800)
        theirs = time.monotonic() - started
        total_mb = COPY_OBJECTS * COPY_MB
        bench.record("s3_copy_1gb", ours, "s", baseline=theirs, baseline_name="rclone copy",
                     target="≤ 1.2x rclone copy", ok=ours <= 1.2 * theirs,
                     mb_per_s=round(total_mb / ours, 1),
                     baseline_mb_per_s=round(total_mb / theirs, 1))
        mount_task = bed.root / "mount.yaml"
        mount_task.write_text(
            f"file_mounts:\n  {scratch}/mounted:\n    source: s3://bench-mount/big\n"
            f"    mode: MOUNT\n  {scratch}/one: s3://bench-mount/big\n"
            "run: |\n"
            "  python3 - <<'PY'\n"
            "  import time\n"
            "  started, size = time.monotonic(), 0\n"
            f"  with open('{scratch}/mounted/object.bin', 'rb') as f:\n"
            "      while chunk := f.read(8 << 20):\n"
            "          size += len(chunk)\n"
            "  print(f'read {size} bytes in {time.monotonic() - started:.3f} s')\n"
            "  PY\n")
        done = bed.ctl("exec", "bench-s3", str(mount_task))
        found = MOUNT_READ.search(done.stdout)
        if done.returncode != 0 or not found:
            raise SystemExit(f"MOUNT exec failed: {done.stdout[-1000:]} {done.stderr[-2000:]}")
        read_s = float(found.group(2))
        copied_s = copy_seconds(done.stderr)
        bench.record("s3_mount_read_500mb", read_s, "s", baseline=copied_s,
                     baseline_name="COPY of the object", target="(reported)",
                     mb_per_s=round(MOUNT_MB / read_s, 1),
                     baseline_mb_per_s=round(MOUNT_MB / copied_s, 1))
    finally:
        bed.down()
