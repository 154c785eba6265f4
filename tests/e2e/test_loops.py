"""The daemon's own loops, on real local clusters: status refresh, autostop timers (and the
agent's own enforcement when no daemon is around), and live events."""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import (
    Daemon,
    autostop_pass_after,
    autostops_fired,
    managed_job,
    managed_job_log,
    pid_alive,
    ray_processes_of,
    running_daemon,
    wait_for,
)

pytestmark = pytest.mark.ray

FAST = {"CLUSTERD_REFRESH_INTERVAL": "1", "CLUSTERD_AUTOSTOP_CHECK": "1"}


@pytest.fixture
def fast_daemon() -> Iterator[Daemon]:
    with running_daemon("cdl-") as daemon:
        daemon.stop()
        daemon.start(extra_env=FAST)
        yield daemon


def run_dir(daemon: Daemon, name: str) -> Path:
    cluster = daemon.cluster(name)
    assert cluster is not None
    return daemon.state_dir / "local" / str(cluster["cloud_name"])


def pid_of(daemon: Daemon, name: str, what: str) -> int:
    return int(json.loads((run_dir(daemon, name) / "run" / f"{what}.pid").read_text())["pid"])


def events(daemon: Daemon, name: str) -> list[dict[str, Any]]:
    result: list[dict[str, Any]] = json.loads(daemon.ctl("events", name, "--json").stdout)
    return result


def status_of(daemon: Daemon, name: str) -> str | None:
    cluster = daemon.cluster(name)
    return None if cluster is None else str(cluster["status"])


def launch(daemon: Daemon, name: str, *args: str) -> None:
    result = daemon.ctl("launch", "-c", name, *args, "--", "echo up")
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]


def test_refresh_notices_a_dead_agent_and_launch_repairs_it(fast_daemon: Daemon) -> None:
    launch(fast_daemon, "r1")
    cloud_name = fast_daemon.cluster("r1")["cloud_name"]  # type: ignore[index]
    os.kill(pid_of(fast_daemon, "r1", "agent"), signal.SIGKILL)
    wait_for(lambda: status_of(fast_daemon, "r1") == "INIT", 30, "the refresh to notice")
    cluster = fast_daemon.cluster("r1")
    assert cluster is not None and "agent" in cluster["status_reason"]
    assert cluster["refreshed_at"] > time.time() - 30
    table = fast_daemon.ctl("status").stdout
    assert "REFRESHED" in table and "ago" in table.splitlines()[1]
    repaired = fast_daemon.ctl("launch", "-c", "r1", "--", "echo repaired")
    assert repaired.returncode == 0 and repaired.stdout == "repaired\n", repaired.stderr
    assert "repairing the runtime" in repaired.stderr
    cluster = fast_daemon.cluster("r1")
    assert cluster is not None and cluster["status"] == "UP"
    assert cluster["cloud_name"] == cloud_name  # repaired in place, not provisioned anew


def test_refresh_notices_a_dead_ray_head(fast_daemon: Daemon) -> None:
    launch(fast_daemon, "r2")
    ray_pid = pid_of(fast_daemon, "r2", "ray")
    os.killpg(ray_pid, signal.SIGKILL)
    wait_for(lambda: status_of(fast_daemon, "r2") == "INIT", 30, "the refresh to notice")
    repaired = fast_daemon.ctl("launch", "-c", "r2", "--", "echo back")
    assert repaired.returncode == 0 and repaired.stdout == "back\n", repaired.stderr
    assert pid_of(fast_daemon, "r2", "ray") != ray_pid


def test_on_demand_refresh_and_in_flight_launches(daemon: Daemon) -> None:
    launcher = daemon.popen_ctl("launch", "-c", "slow", "--", "echo done")
    wait_for(lambda: daemon.cluster("slow") is not None, 30, "the record")
    # A refresh while the launch runs must leave the record alone.
    refreshed = daemon.ctl("status", "--refresh", "--json")
    assert refreshed.returncode == 0
    assert any(c["name"] == "slow" for c in json.loads(refreshed.stdout))
    out, err = launcher.communicate(timeout=240)
    assert launcher.returncode == 0 and out == "done\n", err
    os.kill(pid_of(daemon, "slow", "agent"), signal.SIGKILL)
    wait_for(lambda: not pid_alive(pid_of(daemon, "slow", "agent")), 10, "the agent to die")
    # The periodic refresh is 30 s away; --refresh looks now.
    result = json.loads(daemon.ctl("status", "slow", "--refresh", "--json").stdout)
    assert result[0]["status"] == "INIT"


def test_autostop_stops_an_idle_cluster_on_time(fast_daemon: Daemon) -> None:
    launch(fast_daemon, "idle", "-i", "0.05")
    cluster = fast_daemon.cluster("idle")
    assert cluster is not None and cluster["autostop_minutes"] == 0.05
    # No deadline while the launch's job runs (a check may have seen it busy): one comes as
    # soon as the autostop loop sees the cluster idle.
    deadline = wait_for(lambda: (fast_daemon.cluster("idle") or {}).get("autostop_deadline"),
                        10, "an autostop deadline")
    pids = ray_processes_of(run_dir(fast_daemon, "idle"))
    wait_for(lambda: status_of(fast_daemon, "idle") == "STOPPED", 60, "autostop")
    stopped = next(e for e in events(fast_daemon, "idle") if e["to_status"] == "STOPPED")
    assert stopped["reason"].startswith("autostopped: idle for")
    assert stopped["ts"] - deadline < 10  # fired within seconds of its deadline
    assert not any(pid_alive(p) for p in pids)


def test_autostop_waits_for_jobs_then_for_none(fast_daemon: Daemon, tmp_path: Path) -> None:
    launch(fast_daemon, "busy")
    gate = tmp_path / "gate"
    job = fast_daemon.ctl("exec", "busy", "-d", "--",
                          f"while [ ! -e {gate} ]; do sleep 0.1; done")
    assert job.returncode == 0
    set_at = time.time()
    result = fast_daemon.ctl("autostop", "busy", "-i", "0.02", "--wait-for", "jobs")
    assert result.returncode == 0 and "after 0.02 idle minutes" in result.stdout
    # Were the job not running, the deadline would be 1.2 s after the cluster went idle, so
    # by set_at + 1.2 s at the latest: a pass that began after that has seen it busy.
    later = wait_for(lambda: autostop_pass_after(fast_daemon, set_at + 1.2), 30,
                     "an autostop pass past the deadline")
    assert "busy" in later.checked
    assert status_of(fast_daemon, "busy") == "UP"
    assert autostops_fired(events(fast_daemon, "busy")) == []
    gate.touch()
    wait_for(lambda: status_of(fast_daemon, "busy") == "STOPPED", 60, "autostop after the job")
    start = fast_daemon.ctl("start", "busy")
    assert start.returncode == 0
    # `none`: a hard deadline, whatever runs.
    fast_daemon.ctl("exec", "busy", "-d", "--", "sleep 300")
    result = fast_daemon.ctl("autostop", "busy", "-i", "0.02", "--wait-for", "none")
    assert result.returncode == 0
    wait_for(lambda: status_of(fast_daemon, "busy") == "STOPPED", 60, "the hard deadline")


def test_autostop_cancel_and_down(fast_daemon: Daemon) -> None:
    launch(fast_daemon, "keep", "-i", "0.05")
    launched = time.time()  # idle since before this: the deadline was 3 s after at the latest
    assert fast_daemon.ctl("autostop", "keep", "--cancel").returncode == 0
    later = wait_for(lambda: autostop_pass_after(fast_daemon, launched + 3), 30,
                     "an autostop pass past the cancelled deadline")
    assert "keep" not in later.checked
    assert autostops_fired(events(fast_daemon, "keep")) == []
    cluster = fast_daemon.cluster("keep")
    assert cluster is not None and cluster["status"] == "UP"
    assert cluster["autostop_minutes"] is None
    assert fast_daemon.ctl("autostop", "keep", "-i", "0.02", "--down").returncode == 0
    wait_for(lambda: fast_daemon.cluster("keep") is None, 60, "autodown")
    last = events(fast_daemon, "keep")[-1]
    assert last["to_status"] == "TERMINATED" and last["reason"].startswith("autostopped")


def test_deadline_that_fell_due_while_the_daemon_was_down_fires_at_start(daemon: Daemon
                                                                          ) -> None:
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_AUTOSTOP_CHECK": "3600"})  # it must not fire early
    launch(daemon, "sleepy", "-i", "0.05")
    launched = time.time()  # idle since before this: the deadline is 3 s after at the latest
    assert daemon.stop() == 0
    # The deadline passes with no daemon (and well before the agent's own, 300 s later).
    time.sleep(max(0.0, launched + 3.5 - time.time()))
    daemon.start(extra_env=FAST)
    wait_for(lambda: status_of(daemon, "sleepy") == "STOPPED", 30, "the overdue autostop")


def test_agent_stops_its_cluster_when_no_daemon_comes(daemon: Daemon) -> None:
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_AGENT_AUTOSTOP_GRACE": "2",
                            "CLUSTERD_AUTOSTOP_CHECK": "3600"})  # the daemon never fires
    launch(daemon, "alone", "-i", "0.02")
    ray_pid = pid_of(daemon, "alone", "ray")
    marker = run_dir(daemon, "alone") / "agent" / "autostopped.json"
    daemon.kill()  # no daemon: the agent is on its own
    wait_for(lambda: not pid_alive(ray_pid), 60, "the agent to stop its cluster")
    assert "the agent stopped the cluster itself" in json.loads(marker.read_text())["reason"]
    daemon.start(extra_env=FAST)
    wait_for(lambda: status_of(daemon, "alone") == "STOPPED", 30, "the daemon to settle it")
    last = [e for e in events(daemon, "alone") if e["kind"] == "status"][-1]
    assert last["reason"].startswith("autostop by the agent")
    start = daemon.ctl("start", "alone")
    assert start.returncode == 0, start.stderr
    assert not marker.exists()


def test_events_follow_streams_changes_as_they_happen(daemon: Daemon) -> None:
    launch(daemon, "watched")
    follower = daemon.popen_ctl("events", "watched", "--follow", "--json", "-n", "1")
    assert follower.stdout is not None
    first = json.loads(follower.stdout.readline())
    assert first["cluster"] == "watched"
    assert daemon.ctl("stop", "-y", "watched").returncode == 0
    seen = json.loads(follower.stdout.readline())
    assert (seen["from_status"], seen["to_status"]) == ("UP", "STOPPED")
    assert seen["request_id"] is not None
    follower.send_signal(signal.SIGINT)
    follower.communicate(timeout=30)
    assert follower.returncode == 0


def test_a_managed_job_whose_local_agent_dies_runs_again_in_place(daemon: Daemon) -> None:
    """On `local` there is nowhere else to go: the lost cluster is made again here."""
    submitted = daemon.ctl(
        "jobs", "launch", "-d", "-n", "inplace", "--infra", "local", "--",
        'echo "attempt=$SKYPILOT_MANAGED_JOB_ATTEMPT"; '
        'if [ "$SKYPILOT_MANAGED_JOB_ATTEMPT" = 1 ]; then sleep 600; fi')
    assert submitted.returncode == 0, submitted.stderr

    def managed() -> dict[str, Any]:
        return managed_job(daemon, "inplace")

    def log() -> str:
        return managed_job_log(daemon, "inplace")

    wait_for(lambda: "attempt=1" in log(), 300, "attempt 1 to print", interval=1)
    cluster = managed()["cluster"]
    os.kill(pid_of(daemon, cluster, "agent"), signal.SIGKILL)
    wait_for(lambda: managed()["status"] != "RUNNING", 60, "the loss to be noticed")
    done = wait_for(lambda: (j := managed())["status"] in ("SUCCEEDED", "FAILED",
                                                           "FAILED_CONTROLLER") and j,
                    300, "the job to end", interval=1)
    assert done["status"] == "SUCCEEDED" and done["recoveries"] == 1, (done, daemon.log()[-3000:])
    assert [line for line in log().splitlines() if line.startswith("attempt=")] == [
        "attempt=1", "attempt=2"]
    assert str(done["infra"]).startswith("local")
    assert daemon.cluster(cluster) is None
