"""The daemon killed (SIGKILL, through the test-only fault points) at each phase of launch,
exec and down, then restarted: no record lost, nothing leaked, and the next command finishes
the job. And SIGTERM in the middle of a launch returns within the bound."""

from __future__ import annotations

import json
import sqlite3
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Daemon, pid_alive, ray_processes_of, running_daemon, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon("cdk-") as d:
        yield d


def armed(daemon: Daemon, point: str) -> None:
    """Restart the daemon with one fault point armed."""
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_TEST_FAULTS": point, "CLUSTERD_REFRESH_INTERVAL": "1"})


def restart(daemon: Daemon) -> None:
    daemon.start(extra_env={"CLUSTERD_REFRESH_INTERVAL": "1"})


def latest(daemon: Daemon, op: str) -> dict[str, Any]:
    """The newest recorded request of `op` (the list comes newest first)."""
    recent = json.loads(daemon.ctl("requests", "--all", "--json").stdout)["recent"]
    return next(r for r in recent if r["op"] == op)


def local_dirs(daemon: Daemon) -> list[Path]:
    base = daemon.state_dir / "local"
    return sorted(base.iterdir()) if base.exists() else []


def test_killed_before_the_provider_call(daemon: Daemon) -> None:
    armed(daemon, "launch.before_create")
    result = daemon.ctl("launch", "-c", "early", "--", "echo hi")
    assert result.returncode == 1 and "closed the connection" in result.stderr
    daemon.wait_killed_at_fault_point()
    restart(daemon)
    wait_for(lambda: "interrupted before any node" in
             (daemon.cluster("early") or {}).get("status_reason", ""), 30,
             "the record to say what happened")
    assert daemon.cluster("early")["status"] == "INIT"  # type: ignore[index]
    assert latest(daemon, "launch")["status"] == "INTERRUPTED"
    finished = daemon.ctl("launch", "-c", "early", "--", "echo finished")
    assert finished.returncode == 0 and finished.stdout == "finished\n", finished.stderr
    assert "resuming the interrupted launch" in finished.stderr


def test_killed_after_the_agent_started(daemon: Daemon) -> None:
    armed(daemon, "launch.after_agent")
    daemon.ctl("launch", "-c", "late", "--", "echo hi")
    daemon.wait_killed_at_fault_point()
    restart(daemon)
    # The refresh at start finds everything running: the launch is completed, not redone.
    wait_for(lambda: (daemon.cluster("late") or {}).get("status") == "UP", 30,
             "the refresh to complete the launch")
    assert len(local_dirs(daemon)) == 1
    result = daemon.ctl("exec", "late", "--", "echo works")
    assert result.returncode == 0 and result.stdout == "works\n"


def test_killed_while_submitting_an_exec(daemon: Daemon) -> None:
    assert daemon.ctl("launch", "-c", "ex", "--", "true").returncode == 0
    armed(daemon, "exec.during_submit")
    result = daemon.ctl("exec", "ex", "--", "echo never")
    assert result.returncode == 1
    daemon.wait_killed_at_fault_point()
    restart(daemon)
    queue = json.loads(daemon.ctl("queue", "ex", "--json").stdout)
    assert len(queue) == 1  # only the launch's job: the exec never reached the agent
    assert latest(daemon, "exec")["status"] == "INTERRUPTED"


def test_killed_while_streaming_the_jobs_log(daemon: Daemon, tmp_path: Path) -> None:
    assert daemon.ctl("launch", "-c", "st", "--", "true").returncode == 0
    armed(daemon, "exec.streaming")
    done = tmp_path / "done"
    result = daemon.ctl("exec", "st", "--", f"echo one; sleep 1; echo two; touch {done}")
    assert result.returncode == 1
    daemon.wait_killed_at_fault_point()
    wait_for(done.exists, 60, "the job to finish without a daemon")
    restart(daemon)
    logs = daemon.ctl("logs", "st", "2")
    assert logs.returncode == 0 and logs.stdout == "one\ntwo\n"


def test_killed_in_the_middle_of_down(daemon: Daemon) -> None:
    assert daemon.ctl("launch", "-c", "dn", "--", "true").returncode == 0
    run_dir = local_dirs(daemon)[0]
    pids = ray_processes_of(run_dir)
    armed(daemon, "down.mid_teardown")
    result = daemon.ctl("down", "-y", "dn")
    assert result.returncode == 1
    daemon.wait_killed_at_fault_point()
    restart(daemon)
    assert daemon.cluster("dn") is not None  # no record lost
    again = daemon.ctl("down", "-y", "dn")
    assert again.returncode == 0, again.stderr
    assert daemon.cluster("dn") is None and not run_dir.exists()
    assert not any(pid_alive(p) for p in pids)


def test_sigterm_during_a_launch_returns_promptly(daemon: Daemon) -> None:
    launcher = daemon.popen_ctl("launch", "-c", "term", "--", "echo hi")
    wait_for(lambda: daemon.cluster("term") is not None, 30, "the launch to start")
    started = time.monotonic()
    assert daemon.stop(timeout=15) == 0
    assert time.monotonic() - started < 10
    launcher.communicate(timeout=30)
    restart(daemon)
    cluster = daemon.cluster("term")
    assert cluster is not None  # the intent survived the shutdown
    db = sqlite3.connect(daemon.state_dir / "state.db")
    try:
        (status,) = db.execute(
            "SELECT status FROM requests WHERE op = 'launch' ORDER BY id DESC").fetchone()
    finally:
        db.close()
    assert status in ("CANCELLED", "INTERRUPTED", "SUCCEEDED")
    finished = daemon.ctl("launch", "-c", "term", "--", "echo again")
    assert finished.returncode == 0 and finished.stdout == "again\n", finished.stderr
    assert len(local_dirs(daemon)) == 1
