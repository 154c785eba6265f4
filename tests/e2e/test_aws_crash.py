"""Not one leaked instance: the daemon SIGKILLed at each point of a launch or a teardown on the
EC2 test bed, restarted, and the cluster then resumed or removed; and orphans (instances of
this daemon that no record names) reported and removed on request."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator

import pytest

from tests.e2e.ec2bed import EC2Bed, cloud_name, running
from tests.e2e.test_failover import task
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray]


@pytest.fixture(scope="module")
def crashy(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdcr-")) as daemon:
        yield daemon


def killed_at(daemon: Daemon, point: str, *args: str) -> None:
    """Run `clusterctl ARGS` with the daemon set to kill itself at `point`; then a new one."""
    daemon.stop()
    daemon.start({"CLUSTERD_TEST_FAULTS": point})
    result = daemon.ctl(*args, timeout=600)
    assert result.returncode != 0, f"{point}: the daemon was not killed: {result.stderr}"
    assert daemon.process is not None
    daemon.process.wait(30)
    daemon.start()


def record_of(daemon: Daemon, name: str) -> dict[str, object]:
    cluster = daemon.cluster(name)
    assert cluster is not None, f"the record of {name} was lost"
    return cluster


@pytest.mark.parametrize(("point", "then", "reason"), [
    ("launch.before_create", "resume", "before any node was created"),
    ("launch.after_create", "resume", "after creating 1 node(s) in aws/us-east-1/"),
    ("launch.after_create", "down", "after creating 1 node(s)"),
    ("launch.waiting", "down", "not running"),
    ("launch.during_install", "resume", "not running"),
])
def test_killed_during_a_launch(ec2: EC2Bed, crashy: Daemon, point: str, then: str,
                                reason: str) -> None:
    name = f"{point.split('.')[1].replace('_', '-')}-{then}"
    (crashy.root / f"{name}.yaml").write_text(task(ec2))
    killed_at(crashy, point, "launch", "-c", name, "--infra", "aws/us-east-1",
              f"{name}.yaml")
    record_of(crashy, name)
    status = json.loads(crashy.ctl("status", "--refresh", "--json").stdout)
    mine = next(c for c in status if c["name"] == name)
    assert mine["status"] == "INIT" and reason in mine["status_reason"], mine
    cloud = mine["cloud_name"]
    before = {i["id"] for i in ec2.instances(cloud) if i["state"] != "terminated"}
    if then == "resume":
        resumed = crashy.ctl("launch", "-c", name, f"{name}.yaml", timeout=900)
        assert resumed.returncode == 0, resumed.stderr + crashy.log()[-3000:]
        after = {i["id"] for i in ec2.instances(cloud) if i["state"] != "terminated"}
        assert len(after) == 1 and (not before or after == before)  # reused, not doubled
    down = crashy.ctl("down", "-y", name, timeout=600)
    assert down.returncode == 0, down.stderr
    assert ec2.leftovers(cloud) == []


def test_killed_in_the_middle_of_a_terminate(ec2: EC2Bed, crashy: Daemon) -> None:
    (crashy.root / "mid.yaml").write_text(task(ec2))
    launched = crashy.ctl("launch", "-c", "mid", "--infra", "aws/us-east-1", "mid.yaml",
                          timeout=900)
    assert launched.returncode == 0, launched.stderr
    cloud = cloud_name(crashy, "mid")
    killed_at(crashy, "down.mid_terminate", "down", "-y", "mid")
    assert [i["state"] for i in ec2.instances(cloud)] == ["terminated"]
    # The refresh of the restarted daemon may finish the teardown itself (every node gone:
    # the record goes, the security group with it); otherwise a second down does.
    assert crashy.ctl("status", "--refresh").returncode == 0  # after the start's own cycle
    if crashy.cluster("mid") is not None:
        again = crashy.ctl("down", "-y", "mid", timeout=600)
        assert again.returncode == 0, again.stderr
    assert ec2.leftovers(cloud) == [] and crashy.cluster("mid") is None
    events = json.loads(crashy.ctl("events", "mid", "--json").stdout)
    assert events[-1]["to_status"] == "TERMINATED"


def test_an_orphan_is_reported_and_removed_only_when_asked(ec2: EC2Bed, crashy: Daemon) -> None:
    (crashy.root / "lost.yaml").write_text(task(ec2))
    launched = crashy.ctl("launch", "-c", "lost", "--infra", "aws/us-east-1", "lost.yaml",
                          timeout=900)
    assert launched.returncode == 0, launched.stderr
    cloud = cloud_name(crashy, "lost")
    crashy.stop()
    with sqlite3.connect(crashy.state_dir / "state.db") as db:  # the record, lost
        db.execute("DELETE FROM clusters WHERE name = 'lost'")
    crashy.start()

    def reported() -> bool:
        return cloud in crashy.ctl("status").stderr

    wait_for(reported, 60, "the orphan to be reported", interval=0.5)
    status = crashy.ctl("status")
    assert f"clusterctl down --orphan {cloud}" in status.stderr
    assert [i["state"] for i in ec2.instances(cloud)] == ["running"]  # nothing removed unasked
    events = json.loads(crashy.ctl("events", cloud, "--json").stdout)
    assert events and events[-1]["kind"] == "orphan"
    removed = crashy.ctl("down", "-y", "--orphan", cloud, timeout=600)
    assert removed.returncode == 0, removed.stderr
    assert ec2.leftovers(cloud) == []
    assert cloud not in crashy.ctl("status").stderr
