"""What clients see of a managed job, end to end on the `local` provider (no test bed): a
real job under a real daemon, Ray and agent, through clusterctl: `jobs logs --tail`,
`jobs logs --controller` (followed and not) and `jobs queue`."""

from __future__ import annotations

import contextlib
import json
import re
import subprocess
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Daemon, running_daemon, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

TASK = """
name: views
resources:
  cpus: 1
run: |
  for i in $(seq 1 50); do echo "line $i"; done
  while [ ! -e {go} ]; do sleep 0.2; done
  echo done
"""
# Timestamped entries of `jobs logs --controller` (a traceback's lines are indented).
ENTRY = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3}  ")


@contextlib.contextmanager
def managed_daemon(prefix: str) -> Iterator[Daemon]:
    """A daemon whose managed jobs are all ended (and so their clusters down) when done."""
    with running_daemon(prefix) as d:
        try:
            yield d
        finally:
            # A managed job's cluster is the job's: cancelling the job takes it down.
            d.ctl("jobs", "cancel", "--all")
            wait_for(lambda: not queue(d), 120, "every managed job to end", interval=0.5)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with managed_daemon("cdmv-") as d:
        yield d


def queue(daemon: Daemon, *extra: str) -> list[dict[str, Any]]:
    result = daemon.ctl("jobs", "queue", "--json", *extra)
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def job(daemon: Daemon, job_id: int) -> dict[str, Any]:
    return next(j for j in queue(daemon, "--all") if j["job_id"] == job_id)


def at_time(entry: str) -> float:
    """The time of an entry of `jobs logs --controller` (local time, to the millisecond)."""
    return time.mktime(time.strptime(entry[:19], "%Y-%m-%d %H:%M:%S")) + int(entry[20:23]) / 1e3


def entries(text: str) -> list[str]:
    assert text.endswith("\n"), text
    lines = text.splitlines()
    assert lines and all(ENTRY.match(line) or line.startswith("    ") for line in lines), text
    return [line for line in lines if ENTRY.match(line)]


class Follower:
    """A `clusterctl jobs logs` that follows, its output lines collected as they come."""

    def __init__(self, daemon: Daemon, *args: str) -> None:
        self.process = daemon.popen_ctl("jobs", "logs", *args)
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.process.stdout is not None
        for line in self.process.stdout:
            self.lines.append(line)

    def wait_for_line(self, pattern: str, timeout: float) -> None:
        wait_for(lambda: any(re.search(pattern, line) for line in self.lines), timeout,
                 f"a line matching {pattern!r}; got {self.lines}")

    def finish(self, timeout: float) -> tuple[int, str, str]:
        try:
            code = self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"still following after {timeout} s: {self.lines}") from None
        self._reader.join(10)
        assert self.process.stderr is not None
        return code, "".join(self.lines), self.process.stderr.read()


def test_tail_controller_view_and_queue_of_a_real_job(daemon: Daemon) -> None:
    go = daemon.root / "go"
    (daemon.root / "views.yaml").write_text(TASK.format(go=go))
    launched = daemon.ctl("jobs", "launch", "-d", "--infra", "local", "views.yaml")
    assert launched.returncode == 0, launched.stderr + daemon.log()[-4000:]
    found = re.search(r"Managed job (\d+) submitted", launched.stderr)
    assert found, launched.stderr
    job_id = str(found.group(1))

    def printed_all() -> bool:
        result = daemon.ctl("jobs", "logs", job_id, "--no-follow")
        return "line 50\n" in result.stdout

    wait_for(printed_all, 240, "the job to print its 50 lines", interval=0.5)
    running = job(daemon, int(job_id))
    assert running["status"] == "RUNNING", running

    # The last N lines only, from a log that starts with the attempt's marker line.
    whole = daemon.ctl("jobs", "logs", job_id, "--no-follow")
    assert whole.stdout.startswith(f"=== managed job {job_id}: attempt 1 on ")
    tail = daemon.ctl("jobs", "logs", job_id, "--no-follow", "--tail", "3")
    assert tail.returncode == 101, tail.stderr  # not finished
    assert tail.stdout == "line 48\nline 49\nline 50\n"
    everything = daemon.ctl("jobs", "logs", job_id, "--no-follow", "--tail", "1000")
    assert everything.stdout == whole.stdout

    # `jobs queue` has what the issue names, in both forms.
    shown = running
    assert shown["name"] == "views" and shown["resources"].startswith("1x[CPU:1")
    assert shown["infra"] and shown["infra"].startswith("local")
    assert shown["recoveries"] == 0 and shown["status_reason"].startswith("attempt 1 running")
    assert shown["submitted_at"] > 0 and shown["total_seconds"] >= shown["job_seconds"] >= 0
    table = daemon.ctl("jobs", "queue")
    header, row = table.stdout.splitlines()[:2]
    assert header.split() == ["ID", "NAME", "RESOURCES", "SUBMITTED", "TOT.", "DURATION",
                              "JOB", "DURATION", "#RECOVERIES", "COST", "STATUS", "INFRA",
                              "REASON"]
    assert row.split()[:2] == [job_id, "views"] and "RUNNING" in row and "1x[CPU:1" in row
    assert shown["cost"] == 0 and "$0.000" in row  # its cluster runs on `local`: free

    # Followers of both views, started while the job runs, end when it does.
    follow_tail = Follower(daemon, job_id, "--tail", "2")
    follow_controller = Follower(daemon, job_id, "--controller")
    follow_tail.wait_for_line("^line 50$", 60)
    follow_controller.wait_for_line("STARTING -> RUNNING", 60)
    go.touch()
    code, out, err = follow_tail.finish(120)
    assert (code, out) == (0, "line 49\nline 50\ndone\n"), err
    code, followed, err = follow_controller.finish(120)
    assert code == 0, err + daemon.log()[-4000:]
    assert "Managed job" in err and "SUCCEEDED" in err

    # The controller's view: the status changes with their reasons, and the daemon's own
    # lines about the job, in time order.
    result = daemon.ctl("jobs", "logs", job_id, "--controller", "--no-follow")
    assert result.returncode == 0, result.stderr
    view = entries(result.stdout)
    assert entries(followed) == view

    def at(pattern: str) -> int:
        return next(i for i, line in enumerate(view) if re.search(pattern, line))

    submitted = at(r"  PENDING: submitted$")
    starting = at(r"  PENDING -> STARTING: launching a cluster$")
    running_at = at(rf"  STARTING -> RUNNING: attempt 1 running on mj-{job_id}-views$")
    succeeded = at(r"  RUNNING -> SUCCEEDED: attempt 1 succeeded$")
    assert submitted < starting < running_at < succeeded
    assert at(r"\[info\] managed job submitted  cluster=mj-") < starting
    launch = at(r"\[info\] request started  .*op=launch")
    assert starting < launch < running_at  # the launch request the driver started is its
    teardown = at(r"\[info\] request started  .*op=down")
    assert running_at < teardown < succeeded
    assert at(r"\[info\] managed job ended  status=SUCCEEDED") > succeeded

    # The last N entries, events and lines together.
    last = daemon.ctl("jobs", "logs", job_id, "--controller", "--no-follow", "--tail", "4")
    assert last.returncode == 0 and entries(last.stdout) == view[-4:]

    done = job(daemon, int(job_id))
    assert done["status"] == "SUCCEEDED" and done["ended_at"] >= done["submitted_at"]
    # Its job duration is its run, not the teardown after it (0.1 s: the view rounds).
    ran = at_time(view[teardown]) - at_time(view[running_at])
    assert done["job_seconds"] <= ran + 0.1, (done, ran)
    assert done["total_seconds"] > done["job_seconds"]
    assert daemon.cluster(f"mj-{job_id}-views") is None


def test_logs_of_no_such_job(daemon: Daemon) -> None:
    for extra in ([], ["--controller"], ["--tail", "5"]):
        result = daemon.ctl("jobs", "logs", "999", "--no-follow", *extra)
        assert result.returncode == 102, result.stderr  # NOT_FOUND, as for `jobs logs`
        assert "there is no managed job 999" in result.stderr


def test_an_empty_queue_says_so(daemon: Daemon) -> None:
    wait_for(lambda: not queue(daemon), 120, "no unfinished managed job", interval=0.5)
    result = daemon.ctl("jobs", "queue")
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("No unfinished managed jobs")
