"""clusterctl says what it did once, and refuses what makes no sense, naming the conflict,
before anything runs: driven through the clusterctl binary against a real daemon."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.support import Daemon

pytestmark = pytest.mark.ray

NOT_FOUND = 102


def queue_ids(daemon: Daemon, cluster: str) -> list[int]:
    done = daemon.ctl("queue", cluster, "--json")
    assert done.returncode == 0, done.stderr
    return [int(j["job_id"]) for j in json.loads(done.stdout)]


def managed_jobs(daemon: Daemon) -> list[dict[str, object]]:
    done = daemon.ctl("jobs", "queue", "--all", "--json")
    assert done.returncode == 0, done.stderr
    jobs: list[dict[str, object]] = json.loads(done.stdout)
    return jobs


def test_detached_exec_says_submitted_once_and_exits_0(shared_daemon: Daemon,
                                                       local_cluster: str) -> None:
    done = shared_daemon.ctl("exec", local_cluster, "-d", "--", "echo detached")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("submitted") == 1, done.stderr
    assert f"clusterctl logs {local_cluster}" in done.stderr


def test_detached_managed_job_says_submitted_once_and_exits_0(shared_daemon: Daemon) -> None:
    done = shared_daemon.ctl("jobs", "launch", "-d", "-n", "once", "--", "echo hi")
    assert done.returncode == 0, done.stderr
    assert done.stderr.count("submitted") == 1, done.stderr
    job_id = next(int(j["job_id"]) for j in managed_jobs(shared_daemon) if j["name"] == "once")
    assert shared_daemon.ctl("jobs", "cancel", str(job_id)).returncode == 0


def test_autostop_set_and_cancelled_at_once_is_refused(shared_daemon: Daemon,
                                                       local_cluster: str) -> None:
    for extra in (["-i", "5"], ["--down"]):
        done = shared_daemon.ctl("autostop", local_cluster, *extra, "--cancel")
        assert done.returncode == 1, done.stderr
        assert "cancel removes autostop" in done.stderr
        assert "hint:" in done.stderr
    status = json.loads(shared_daemon.ctl("status", local_cluster, "--json").stdout)
    assert status[0].get("autostop") in (None, {}), status


def test_two_names_for_one_managed_job_are_refused(shared_daemon: Daemon) -> None:
    before = len(managed_jobs(shared_daemon))
    done = shared_daemon.ctl("jobs", "launch", "-n", "alpha", "--name", "beta", "--",
                             "echo hi")
    assert done.returncode == 1
    assert "'alpha'" in done.stderr and "'beta'" in done.stderr
    assert len(managed_jobs(shared_daemon)) == before


def test_a_task_file_with_arguments_or_a_directory_is_no_task(
        shared_daemon: Daemon, local_cluster: str, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text("run: echo from the file\n")
    (tmp_path / "somedir").mkdir()
    before = queue_ids(shared_daemon, local_cluster)
    done = shared_daemon.ctl("exec", local_cluster, str(task), "--lr", "0.1")
    assert done.returncode in (1, 2), done.stderr  # argparse: an option it does not know
    done = shared_daemon.ctl("exec", local_cluster, str(task), "extra")
    assert done.returncode == 1
    assert "takes no arguments" in done.stderr and "extra" in done.stderr
    done = shared_daemon.ctl("exec", local_cluster, str(tmp_path / "somedir"))
    assert done.returncode == 1
    assert "is a directory, not a task" in done.stderr
    assert queue_ids(shared_daemon, local_cluster) == before
    # After `--` the words are a command, whatever they look like.
    done = shared_daemon.ctl("exec", local_cluster, "--", "echo", "task.yaml", "extra")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "task.yaml extra"


def test_events_of_an_unknown_cluster_is_not_found(shared_daemon: Daemon) -> None:
    done = shared_daemon.ctl("events", "never-made")
    assert done.returncode == NOT_FOUND
    assert "does not exist" in done.stderr
    launched = shared_daemon.ctl("launch", "-c", "short-lived", "--", "true")
    assert launched.returncode == 0, launched.stderr
    assert shared_daemon.ctl("down", "-y", "short-lived").returncode == 0
    history = shared_daemon.ctl("events", "short-lived")
    assert history.returncode == 0, history.stderr
    assert "TERMINATED" in history.stdout


def test_show_gpus_of_a_provider_not_offered_is_refused(shared_daemon: Daemon) -> None:
    done = shared_daemon.ctl("show-gpus", "--infra", "gcp")
    assert done.returncode == 1
    assert "unknown infra 'gcp'" in done.stderr
    assert shared_daemon.ctl("show-gpus", "--infra", "aws").returncode == 0


def test_managed_jobs_that_no_launch_could_run_are_refused_at_submission(
        shared_daemon: Daemon) -> None:
    before = len(managed_jobs(shared_daemon))
    done = shared_daemon.ctl("jobs", "launch", "-d", "-n", "ñame", "--", "echo hi")
    assert done.returncode == 1
    assert "ASCII" in done.stderr
    done = shared_daemon.ctl("jobs", "launch", "-d", "--infra", "nowhere", "--", "echo hi")
    assert done.returncode == 1
    assert "unknown infra 'nowhere'" in done.stderr
    assert len(managed_jobs(shared_daemon)) == before


def test_a_long_name_is_echoed_cut(shared_daemon: Daemon) -> None:
    name = "x" * 300
    for args in (["status", name], ["launch", "-c", name, "--", "true"],
                 ["logs", name, "1"], ["launch", "--infra", "y" * 300, "--", "true"]):
        done = shared_daemon.ctl(*args)
        assert done.returncode == 1, done.stderr
        assert "x" * 50 not in done.stderr and "y" * 50 not in done.stderr, done.stderr
        assert "..." in done.stderr


def test_task_warnings_come_before_any_node_is_made(shared_daemon: Daemon,
                                                    tmp_path: Path) -> None:
    task = tmp_path / "spot.yaml"
    task.write_text("resources:\n  use_spot: true\n  disk_tier: high\nrun: echo hi\n")
    done = shared_daemon.ctl("launch", "-c", "warned-first", str(task))
    try:
        assert done.returncode == 0, done.stderr
        lines = done.stderr.splitlines()
        making = next(i for i, line in enumerate(lines) if "creating nodes" in line)
        spot = next(i for i, line in enumerate(lines) if "resources.use_spot" in line)
        tier = next(i for i, line in enumerate(lines) if "resources.disk_tier" in line)
        assert spot < making and tier < making, done.stderr
        assert done.stderr.count("resources.use_spot") == 1
    finally:
        shared_daemon.ctl("down", "-y", "warned-first")
