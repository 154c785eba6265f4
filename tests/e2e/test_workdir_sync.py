"""A task's workdir sync end to end on local clusters (issue 35): a workdir holding clusterd's
own state is refused before anything is made or copied, and a large one is warned of (with its
largest entries; refused under --strict) and shows its progress while it is copied."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from tests.support import Daemon

pytestmark = pytest.mark.ray


def _job_ids(daemon: Daemon, cluster: str) -> set[int]:
    listed = daemon.ctl("queue", cluster, "--json")
    assert listed.returncode == 0, listed.stderr
    return {job["job_id"] for job in json.loads(listed.stdout)}


def test_a_workdir_holding_clusterd_s_state_is_refused_before_anything_is_copied(
        shared_daemon: Daemon, local_cluster: str, tmp_path: Path) -> None:
    """As `workdir: .` run from a directory holding clusterd's state dir (here the daemon's
    root holds its XDG dirs): the local node's workdir lives there too, so the copy would
    copy itself without end."""
    task = tmp_path / "self.yaml"
    task.write_text(f"workdir: {shared_daemon.root}\nrun: echo ran\n")
    before = _job_ids(shared_daemon, local_cluster)
    refused = shared_daemon.ctl("exec", local_cluster, str(task))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "[INVALID_TASK]" in refused.stderr
    state = os.path.realpath(shared_daemon.root / "state" / "clusterd")
    assert f"workdir: {shared_daemon.root} holds clusterd's state directory, {state}" in (
        refused.stderr)
    assert "syncing workdir" not in refused.stderr
    assert _job_ids(shared_daemon, local_cluster) == before
    # A launch is refused before any cluster is made.
    launched = shared_daemon.ctl("launch", "-c", "selfcopy", "--infra", "local", str(task))
    assert launched.returncode == 1 and "[INVALID_TASK]" in launched.stderr
    assert shared_daemon.cluster("selfcopy") is None
    # Left out by the workdir's .skyignore, the state dir is no obstacle... except that the
    # local node's own workdir sits inside it: that copy into itself is always refused.
    skyignore = shared_daemon.root / ".skyignore"
    skyignore.write_text("state/\nrt/\nconfig/\n*.yaml\n")
    try:
        inside = shared_daemon.ctl("exec", local_cluster, str(task))
    finally:
        skyignore.unlink()
    assert inside.returncode == 1 and "[INVALID_TASK]" in inside.stderr
    assert "holds its own destination" in inside.stderr


def test_a_large_workdir_is_warned_of_shows_progress_and_is_refused_under_strict(
        shared_daemon: Daemon, local_cluster: str, tmp_path: Path) -> None:
    workdir = tmp_path / "big"
    (workdir / "data").mkdir(parents=True)
    chunk = os.urandom(10_000_000)
    try:
        # 2.2 GB: above the 1 GB threshold, and long enough to copy for progress lines.
        for i in range(200):
            (workdir / "data" / f"part{i:03}").write_bytes(chunk)
        (workdir / "weights.bin").write_bytes(chunk * 2)
        (workdir / "train.py").write_text("print('trained')\n")
        task = tmp_path / "big.yaml"
        task.write_text(f"workdir: {workdir}\nrun: python train.py\n")
        before = _job_ids(shared_daemon, local_cluster)
        strict = shared_daemon.ctl("exec", local_cluster, "--strict", str(task))
        assert strict.returncode == 1 and "[INVALID_TASK]" in strict.stderr
        assert "sends 2.0 GB in 202 files" in strict.stderr
        assert _job_ids(shared_daemon, local_cluster) == before

        ran = shared_daemon.ctl("exec", local_cluster, str(task), timeout=600)
        assert ran.returncode == 0, ran.stderr
        assert ran.stdout == "trained\n"
        assert (f"warning: workdir: {workdir} sends 2.0 GB in 202 files (more than 1.0 GB); "
                "largest: data (2.0 GB), weights.bin (20.0 MB), train.py (17 B)") in ran.stderr
        progress = [line for line in ran.stderr.splitlines()
                    if "syncing workdir: " in line and " files sent (" in line]
        assert progress, ran.stderr
        events = json.loads(shared_daemon.ctl("events", local_cluster, "--json").stdout)
        assert any(e["kind"] == "warning" and e["reason"].startswith("workdir: ")
                   for e in events)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
