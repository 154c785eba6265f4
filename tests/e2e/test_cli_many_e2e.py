"""What a SkyPilot user types beyond launch/exec (issue 38), through the clusterctl binary
against a real daemon on local clusters: several clusters, globs and --all; `queue` of every
cluster; `logs --status` and `--sync-down`; `status --ip` and `--endpoints`; `check
PROVIDER`; `show-gpus NAME:COUNT`; and managed jobs' `jobs logs` (the newest), `jobs cancel
-n` and `jobs queue -s --since/--until`. Parsing is in tests/unit/test_cli_many.py."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.support import Daemon, running_daemon, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

PORTS_TASK = "resources:\n  infra: local\n  ports: [8080, '9000-9001']\n"


def ok(result: Any) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return str(result.stdout)


def status_of(daemon: Daemon) -> dict[str, str]:
    return {c["name"]: c["status"] for c in daemon.status()}


def test_many_clusters_by_name_glob_and_all(daemon: Daemon, tmp_path: Any) -> None:
    (daemon.root / "ports.yaml").write_text(PORTS_TASK)
    ok(daemon.ctl("launch", "-c", "cm-a", "ports.yaml"))
    ok(daemon.ctl("launch", "-c", "cm-b", "--", "echo b-job"))

    # status --ip / --endpoints / --endpoint: the head (this machine) and the task's ports.
    assert ok(daemon.ctl("status", "--ip", "cm-a")) == "127.0.0.1\n"
    assert ok(daemon.ctl("status", "--endpoints", "cm-a")) == (
        "8080: http://127.0.0.1:8080\n9000: http://127.0.0.1:9000\n"
        "9001: http://127.0.0.1:9001\n")
    assert ok(daemon.ctl("status", "--endpoint", "9001", "cm-a")) == "http://127.0.0.1:9001\n"
    none = daemon.ctl("status", "--endpoints", "cm-b")
    assert none.returncode == 1 and "opens no ports" in none.stderr
    assert daemon.ctl("status", "--ip", "nosuch").returncode == 102

    # Jobs on both; queue with no cluster lists every UP cluster's, with a CLUSTER column.
    assert ok(daemon.ctl("exec", "cm-a", "--", "echo a-job")) == "a-job\n"
    assert daemon.ctl("exec", "cm-b", "--", "exit 3").returncode == 100
    jobs = json.loads(ok(daemon.ctl("queue", "--json")))
    assert sorted((j["cluster"], j["job_id"], j["status"]) for j in jobs) == [
        ("cm-a", 1, "SUCCEEDED"), ("cm-b", 1, "SUCCEEDED"), ("cm-b", 2, "FAILED")]
    table = ok(daemon.ctl("queue", "-s", "cm-b", "cm-a")).splitlines()
    assert table[0].split()[:2] == ["CLUSTER", "ID"] and len(table) == 1  # all finished
    assert ok(daemon.ctl("queue", "cm-a")).startswith("Jobs on cm-a:\n")

    # logs --status: the job's status, and its code as the exit code; no log.
    latest = daemon.ctl("logs", "--status", "cm-b")
    assert (latest.returncode, latest.stdout) == (100, "Job 2 on cm-b: FAILED\n")
    first = daemon.ctl("logs", "--status", "cm-b", "1")
    assert (first.returncode, first.stdout) == (0, "Job 1 on cm-b: SUCCEEDED\n")
    assert daemon.ctl("logs", "--status", "cm-b", "9").returncode == 102

    # logs --sync-down: into DIR/JOB/run.log, by default under ~/clusterd_logs/CLUSTER.
    copied = daemon.ctl("logs", "--sync-down", "cm-b", "1", "2", str(tmp_path / "out"))
    assert copied.returncode == 0, copied.stderr
    assert (tmp_path / "out" / "1" / "run.log").read_text() == "b-job\n"
    assert (tmp_path / "out" / "2" / "run.log").exists()
    assert f"Logs are in {tmp_path / 'out'}" in copied.stderr
    home = tmp_path / "home"
    home.mkdir()
    ok(daemon.ctl("logs", "-s", "cm-a", env={"HOME": str(home)}))
    assert (home / "clusterd_logs" / "cm-a" / "1" / "run.log").read_text() == "a-job\n"

    # autostop of a glob: SkyPilot's default of 5 idle minutes.
    ok(daemon.ctl("autostop", "-y", "cm-*"))
    assert {c["name"]: c["autostop_minutes"] for c in daemon.status()} == {"cm-a": 5,
                                                                           "cm-b": 5}
    # A pattern that matches nothing, alone: 102 with a hint, nothing done.
    nothing = daemon.ctl("stop", "-y", "zz-*")
    assert nothing.returncode == 102 and "clusterctl status" in nothing.stderr
    # A name that is not there does not stop the others; the exit code is the worst.
    stop = daemon.ctl("stop", "-y", "cm-*", "nosuch")
    assert stop.returncode == 102, stop.stderr
    assert "Cluster cm-a stopped." in stop.stdout and "Cluster cm-b stopped." in stop.stdout
    assert "nosuch" in stop.stderr
    assert status_of(daemon) == {"cm-a": "STOPPED", "cm-b": "STOPPED"}
    start = daemon.ctl("start", "-y", "cm-?")
    assert start.returncode == 0, start.stderr
    assert status_of(daemon) == {"cm-a": "UP", "cm-b": "UP"}
    down = daemon.ctl("down", "-a", "-y")
    assert down.returncode == 0 and "Cluster cm-b torn down." in down.stdout, down.stderr
    assert status_of(daemon) == {}
    assert daemon.ctl("down", "-a", "-y").returncode == 102  # nothing left to act on


def test_check_and_show_gpus_narrowed(shared_daemon: Daemon) -> None:
    checked = json.loads(ok(shared_daemon.ctl("check", "local", "--json")))
    assert list(checked["providers"]) == ["local"] and checked["providers"]["local"]["ok"]
    assert shared_daemon.ctl("check", "gcp").returncode == 1
    rows = json.loads(ok(shared_daemon.ctl("show-gpus", "A100:8", "--infra", "aws", "--json")))
    assert rows and {(r["accelerator"], r["count"]) for r in rows} == {("A100", 8)}
    table = ok(shared_daemon.ctl("show-gpus", "A100:8", "--infra", "aws"))
    assert "p4d.24xlarge" in table
    refused = shared_daemon.ctl("show-gpus", "A100:3", "--infra", "aws")
    assert refused.returncode == 1 and "counts offered: " in refused.stderr


MANAGED = """
name: cmj
resources:
  cpus: 1
run: |
  echo started
  while [ ! -e {go} ]; do sleep 0.2; done
"""


def managed(daemon: Daemon, *extra: str) -> list[dict[str, Any]]:
    jobs: list[dict[str, Any]] = json.loads(ok(daemon.ctl("jobs", "queue", "--json", *extra)))
    return jobs


def test_managed_jobs_newest_by_name_and_windows() -> None:
    with running_daemon("cdcm-") as daemon:
        try:
            (daemon.root / "cmj.yaml").write_text(MANAGED.format(go=daemon.root / "never"))
            ok(daemon.ctl("jobs", "launch", "-d", "--infra", "local", "cmj.yaml"))
            wait_for(lambda: any(j["status"] == "RUNNING" for j in managed(daemon)), 180,
                     "the managed job to run", interval=0.5)
            assert [j["name"] for j in managed(daemon, "-s", "--since", "1h")] == ["cmj"]
            assert managed(daemon, "--until", "1h") == []
            wait_for(lambda: "started" in daemon.ctl("jobs", "logs", "--no-follow").stdout,
                     60, "the job's first line", interval=0.5)
            cancel = daemon.ctl("jobs", "cancel", "-n", "cmj")
            assert cancel.returncode == 0 and "cancelling" in cancel.stderr, cancel.stderr
            followed = daemon.ctl("jobs", "logs", timeout=180)  # the newest, to its end
            assert followed.returncode == 103, followed.stderr
            assert "started" in followed.stdout and "CANCELLED" in followed.stderr
            # Ended: listed in a window, not with -s; a name that is gone is 102.
            assert [j["status"] for j in managed(daemon, "--since", "1h")] == ["CANCELLED"]
            assert managed(daemon, "-s", "--since", "1h") == []
            assert daemon.ctl("jobs", "cancel", "-n", "other").returncode == 102
        finally:
            daemon.ctl("jobs", "cancel", "--all")
            wait_for(lambda: not managed(daemon), 120, "every managed job to end",
                     interval=0.5)
