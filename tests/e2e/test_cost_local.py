"""The cost ledger end to end on the `local` provider (issue 39): launch, a job, stop, start,
down; the report has each interval, at $0, with times inside what the test measured."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.support import Daemon, running_daemon

pytestmark = pytest.mark.ray


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon("cdcost-") as d:
        yield d


def report(daemon: Daemon) -> dict[str, Any]:
    result = daemon.ctl("cost-report", "--json")
    assert result.returncode == 0, result.stderr
    parsed: dict[str, Any] = json.loads(result.stdout)
    return parsed


def test_a_local_clusters_life_is_in_the_ledger(daemon: Daemon) -> None:
    empty = report(daemon)
    assert empty["clusters"] == [] and empty["total"] == 0

    before_launch = time.time()
    launch = daemon.ctl("launch", "-c", "money", "--", "echo paid")
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    launched = time.time()
    status = json.loads(daemon.ctl("status", "--json").stdout)
    assert [(c["name"], c["cost_per_hour"], c["cost"]) for c in status] == [("money", 0, 0)]
    assert "COST $/H" in daemon.ctl("status").stdout

    before_stop = time.time()
    assert daemon.ctl("stop", "-y", "money").returncode == 0
    stopped = time.time()
    assert daemon.ctl("start", "money").returncode == 0
    started = time.time()
    live = next(c for c in report(daemon)["clusters"] if c["name"] == "money")
    assert live["live"] and [i["kind"] for i in live["intervals"]] == [
        "running", "stopped", "running"]
    assert daemon.ctl("down", "-y", "money").returncode == 0
    downed = time.time()

    (money,) = report(daemon)["clusters"]
    assert money["provider"] == "local" and money["cost"] == 0 and not money["live"]
    assert money["sources"] == ["local (free)"]
    first, pause, second = money["intervals"]
    # Each edge where the test saw it happen (the daemon's clock is this machine's).
    assert before_launch <= first["started_at"] <= launched
    assert before_stop <= first["ended_at"] <= stopped
    assert pause["started_at"] == first["ended_at"] and pause["kind"] == "stopped"
    assert stopped <= pause["ended_at"] <= second["started_at"] <= started
    assert started <= second["ended_at"] <= downed
    # The job's share is named (at $0), with setup and idle beside it.
    assert [j["job_id"] for j in money["split"]["jobs"]] == [1]
    text = daemon.ctl("cost-report")
    assert text.returncode == 0 and "money" in text.stdout and "Total: $0" in text.stdout
    # One cluster asked for by name (what the dashboard's cluster page asks).
    alone = daemon.ctl("cost-report", "--cluster", "money", "--json")
    assert alone.returncode == 0, alone.stderr
    assert [c["name"] for c in json.loads(alone.stdout)["clusters"]] == ["money"]
    none = daemon.ctl("cost-report", "--cluster", "never-was")
    assert none.returncode == 0 and "Cluster never-was did not run in the last 30 days" in (
        none.stdout)
    bad = daemon.ctl("cost-report", "--cluster", "no/such name")
    assert bad.returncode != 0 and "INVALID_NAME" in bad.stderr, bad.stderr


def test_kill_9_loses_no_second_and_counts_none_twice(daemon: Daemon) -> None:
    launch = daemon.ctl("launch", "-c", "through", "--", "true")
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    daemon.kill()  # SIGKILL: the open interval stays open in the database
    daemon.start()
    # Refreshes after the restart find the node still running: the same interval goes on.
    assert daemon.ctl("status", "--refresh").returncode == 0
    assert daemon.ctl("status", "--refresh").returncode == 0
    (live,) = report(daemon)["clusters"]
    (interval,) = live["intervals"]
    assert interval["ended_at"] is None and live["live"]
    assert daemon.ctl("down", "-y", "through").returncode == 0
    (gone,) = report(daemon)["clusters"]
    assert [i["started_at"] for i in gone["intervals"]] == [interval["started_at"]]
    assert gone["intervals"][0]["ended_at"] is not None
    assert "IntegrityError" not in daemon.log()  # no hook tried a second open interval
