"""Runs the modules that talk to moto's server (the aws provider, S3 storage) in a network
namespace with only `lo` (`unshare --net`): they reach moto on 127.0.0.1, and a connect to any
other address fails at once instead of leaving the machine."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from clusterd.config import Settings
from clusterd.storage.node_rclone import NodeRclone

ROOT = Path(__file__).resolve().parents[2]
MODULES = ["tests/integration/test_aws_provider.py", "tests/integration/test_s3_storage.py",
           "tests/integration/test_aws_iam.py"]


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare (util-linux) for a network namespace")
@pytest.mark.parametrize("module", MODULES)
def test_against_moto_in_a_namespace_with_only_lo(module: str) -> None:
    # What `clusterd --prepare-runtime` readies while the package index is reachable: the
    # nodes' rclone, which the S3 module's mounts use and cannot fetch from inside.
    NodeRclone(Settings.from_env().wheelhouse_dir).build(os.uname().machine)
    script = ('ip link set lo up && exec "$0" -m pytest -p no:cacheprovider -q -rs '
              f'"{module}"')
    result = subprocess.run(
        ["unshare", "--net", "sh", "-c", script, sys.executable], cwd=ROOT,
        env={**os.environ, "CLUSTERD_TEST_IN_NETNS": "1"}, capture_output=True, text=True,
        timeout=900)
    output = result.stdout[-8000:] + result.stderr[-4000:]
    assert result.returncode == 0, output
    summary = result.stdout.strip().splitlines()[-1]
    assert " passed" in summary and "skipped" not in summary, output
