"""Jobs' logs outlive their cluster (issue 38, part 3): the daemon keeps a copy while jobs run
and at stop/down, serves it once the head is gone (saying it is the kept copy, and whether
complete), resumes the copy after being killed (nothing lost, nothing doubled), keeps to its
caps, and lists torn-down clusters in `clusterctl history`."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Daemon, running_daemon, wait_for

pytestmark = pytest.mark.ray

FAST = {"CLUSTERD_KEPT_LOG_INTERVAL": "0.2"}


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon("cdkl-") as d:
        d.stop()
        d.start(extra_env=FAST)
        yield d


def kept_files(daemon: Daemon, cluster: str, job_id: int) -> list[Path]:
    return sorted((daemon.state_dir / "kept-logs").glob(f"{cluster}@*/{job_id}.log"))


def history(daemon: Daemon, *args: str) -> list[dict[str, object]]:
    result = daemon.ctl("history", *args, "--json")
    assert result.returncode == 0, result.stderr
    rows: list[dict[str, object]] = json.loads(result.stdout)
    return rows


def test_a_jobs_log_is_read_after_stop_and_after_down(daemon: Daemon) -> None:
    launch = daemon.ctl("launch", "-c", "kl", "--", "echo hello; echo world")
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    # A job still running when the cluster stops: its copy is what was there.
    running = daemon.ctl("exec", "kl", "-d", "--", "echo started; sleep 600")
    assert running.returncode == 0, running.stderr
    wait_for(lambda: any(p.read_bytes() == b"started\n" for p in kept_files(daemon, "kl", 2)),
             60, "the running job's log to be copied")

    assert daemon.ctl("stop", "-y", "kl").returncode == 0
    stopped = daemon.ctl("logs", "kl", "1")
    assert stopped.returncode == 0, stopped.stderr
    assert stopped.stdout == "hello\nworld\n"
    assert "kept copy of job 1's log (cluster kl, stopped); complete" in stopped.stderr
    cut_short = daemon.ctl("logs", "kl", "2")
    assert cut_short.returncode == 103, cut_short.stderr  # cancelled by the stop
    # Which it is depends on who came first: the stop's last copy while the agent still ran
    # the job (incomplete), or the agent's cancel of it and then the copy, followed to the
    # log's end (complete: the job had ended and the copy has all of it).
    assert cut_short.stdout == "started\n"
    assert "; incomplete" in cut_short.stderr or "; complete)" in cut_short.stderr, (
        cut_short.stderr)

    assert daemon.ctl("start", "kl").returncode == 0
    assert daemon.ctl("down", "-y", "kl").returncode == 0
    gone = daemon.ctl("logs", "kl")  # the latest job, as for a live cluster
    assert gone.returncode == 103 and gone.stdout == "started\n", gone.stderr
    first = daemon.ctl("logs", "--no-follow", "kl", "1")
    assert first.returncode == 0 and first.stdout == "hello\nworld\n", first.stderr
    assert "torn down" in first.stderr and "; complete" in first.stderr
    missing = daemon.ctl("logs", "kl", "9")
    assert missing.returncode == 102 and "kept no log of job 9" in missing.stderr

    (row,) = history(daemon, "kl")
    assert row["name"] == "kl" and row["infra"] == "local" and row["status"] == "TERMINATED"
    assert "torn down by request" in str(row["reason"]) and row["torn_down_at"]
    jobs = row["jobs"]
    assert isinstance(jobs, list)
    assert [(j["job_id"], j["status"]) for j in jobs] == [(1, "SUCCEEDED"), (2, "CANCELLED")]
    assert jobs[0]["complete"] is True
    table = daemon.ctl("history")
    assert table.returncode == 0 and "kl" in table.stdout and "local" in table.stdout


def test_the_copy_resumes_after_the_daemon_is_killed_mid_job(daemon: Daemon) -> None:
    lines = 400
    command = f"for i in $(seq 1 {lines}); do echo line $i; sleep 0.01; done"
    launch = daemon.ctl("launch", "-c", "kk", "-d", "--", command)
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    wait_for(lambda: any(p.stat().st_size > 100 for p in kept_files(daemon, "kk", 1)),
             120, "the job's log to start being copied")
    daemon.kill()  # SIGKILL, mid-copy
    daemon.start(extra_env=FAST)
    wait_for(lambda: json.loads(daemon.ctl("queue", "kk", "--json").stdout)[0]["status"]
             == "SUCCEEDED", 120, "the job to finish")
    assert daemon.ctl("down", "-y", "kk").returncode == 0
    kept = daemon.ctl("logs", "kk", "1")
    assert kept.returncode == 0, kept.stderr
    assert kept.stdout == "".join(f"line {i}\n" for i in range(1, lines + 1))
    assert "; complete" in kept.stderr


def test_a_copy_over_its_cap_keeps_its_end_and_says_what_went(tmp_path: Path) -> None:
    with running_daemon("cdkc-") as daemon:
        daemon.stop()
        daemon.start(extra_env={**FAST, "CLUSTERD_KEPT_LOG_JOB_BYTES": "4000"})
        command = "for i in $(seq 1 2000); do echo line $i; done"
        launch = daemon.ctl("launch", "-c", "kc", "--", command)
        assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
        assert daemon.ctl("down", "-y", "kc").returncode == 0
        kept = daemon.ctl("logs", "kc", "1")
        assert kept.returncode == 0, kept.stderr
        header, *rest = kept.stdout.splitlines()
        assert header.startswith("[clusterd: the first ") and "under 4 KB" in header
        dropped = int(header.split()[3])
        full = "".join(f"line {i}\n" for i in range(1, 2001))
        assert "\n".join(rest) + "\n" == full[dropped:]
        assert rest[-1] == "line 2000" and len(kept.stdout) <= 4000 + len(header) + 1
