"""SkyPilot's launch/exec flags end to end, on a real daemon and a local cluster: each one's
effect reaches the job (--env-file, --workdir, --no-setup, resource flags checked against the
cluster), and --dryrun prints the plan and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import Daemon

pytestmark = pytest.mark.ray


def test_dryrun_prints_the_plan_and_makes_nothing(shared_daemon: Daemon, local_cluster: str,
                                                  tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    workdir.mkdir()
    (workdir / "data.txt").write_text("0123456789")
    words = ("launch", "-c", "dry", "--dryrun", "--ports", "8080", "--ports", "10000-10010",
             "--workdir", str(workdir), "-i", "7")
    requests_before = shared_daemon.ctl("requests", "--all", "--json").stdout
    plan = shared_daemon.ctl(*words, "--json", "--", "echo never")
    assert plan.returncode == 0, plan.stderr
    answer = json.loads(plan.stdout)
    assert (answer["step"], answer["exists"], answer["placement"]["infra"]) == (
        "new", False, "local")
    assert answer["task"]["ports"] == ["8080", "10000-10010"]
    assert answer["requested"]["ports"] == ["8080", "10000-10010"]
    assert answer["sync"] == [{"field": "workdir", "source": str(workdir), "files": 1,
                               "bytes": 10}]
    assert answer["autostop"]["idle_minutes"] == 7
    text = shared_daemon.ctl(*words, "--", "echo never")
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[:2] == [
        "plan:      a new cluster dry (dry run: nothing is made)", "placement: local"]
    assert "ports:     8080, 10000-10010" in text.stdout
    assert f"sync:      workdir: {workdir}: 1 file, 10 B" in text.stdout
    # No record, no request, no event: the daemon acted on nothing.
    assert shared_daemon.cluster("dry") is None
    assert shared_daemon.ctl("events", "dry").returncode == 102
    assert shared_daemon.ctl("requests", "--all", "--json").stdout == requests_before
    # An existing cluster: what would happen to it.
    reuse = json.loads(shared_daemon.ctl("launch", "-c", local_cluster, "--dryrun", "--json",
                                         "--", "true").stdout)
    assert (reuse["step"], reuse["status"]) == ("reuse", "UP")


def test_env_file_workdir_and_no_setup_reach_the_job(shared_daemon: Daemon, local_cluster: str,
                                                     tmp_path: Path) -> None:
    env_file = tmp_path / "job.env"
    env_file.write_text("# settings\nexport MODEL='llama 3'\nSTEPS=10  # few\nLR=0.1\n")
    workdir = tmp_path / "code"
    workdir.mkdir()
    (workdir / "marker.txt").write_text("from the workdir\n")
    ran = shared_daemon.ctl("exec", local_cluster, "--env-file", str(env_file), "--env",
                            "LR=0.5", "--workdir", str(workdir), "--",
                            'echo "$MODEL/$STEPS/$LR"; cat marker.txt')
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout.splitlines() == ["llama 3/10/0.5", "from the workdir"]
    task = tmp_path / "setup.yaml"
    task.write_text("setup: echo SETUP-RAN\nrun: echo RUN-RAN\n")
    with_setup = shared_daemon.ctl("launch", "-c", local_cluster, str(task))
    assert with_setup.returncode == 0, with_setup.stderr
    assert with_setup.stdout.splitlines() == ["SETUP-RAN", "RUN-RAN"]
    skipped = shared_daemon.ctl("launch", "-c", local_cluster, "--no-setup", "-y", "--fast",
                                str(task))
    assert skipped.returncode == 0, skipped.stderr
    assert skipped.stdout.splitlines() == ["RUN-RAN"]


def test_resource_flags_are_the_jobs_demands_on_exec(shared_daemon: Daemon,
                                                     local_cluster: str) -> None:
    refused = shared_daemon.ctl("exec", local_cluster, "--gpus", "A100:1", "--", "true")
    assert refused.returncode == 1 and "[CLUSTER_MISMATCH]" in refused.stderr
    assert "asks for A100:1" in refused.stderr
    bad = shared_daemon.ctl("exec", local_cluster, "--memory", "lots", "--", "true")
    assert bad.returncode == 1 and "--memory: resources.memory:" in bad.stderr
    fits = shared_daemon.ctl("exec", local_cluster, "--cpus", "1", "--gpus", "none", "--",
                             "echo fits")
    assert fits.returncode == 0 and fits.stdout == "fits\n", fits.stderr
