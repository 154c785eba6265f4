"""Managed jobs end to end on the EC2 test bed (moto's API, real sshd nodes, real Ray and
agents, the daemon as controller), through clusterctl: recovery from a spot preemption,
user failures with and without restarts, cancel, and a daemon killed under a running job.
Every test also checks that no instance or security group is left."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(1500)]

FINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS",
         "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"}


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdmj-", CLUSTERD_AGENT_AUTOSTOP_GRACE="5",
                            CLUSTERD_RETRY_GAP="2", CLUSTERD_RETRY_MAX_GAP="5")) as daemon:
        try:
            yield daemon
        finally:
            # The clusters of managed jobs are theirs: `down` refuses them, cancel takes them.
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.ctl("jobs", "cancel", "--all")
                wait_for(lambda: not queue(daemon), 300, "every managed job to end")


def queue(daemon: Daemon, *, all: bool = False) -> list[dict[str, Any]]:
    result = daemon.ctl("jobs", "queue", "--json", *(["--all"] if all else []))
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def job(daemon: Daemon, job_id: int) -> dict[str, Any]:
    return next(j for j in queue(daemon, all=True) if j["job_id"] == job_id)


def submit(daemon: Daemon, task: str, name: str) -> int:
    (daemon.root / f"{name}.yaml").write_text(task)
    result = daemon.ctl("jobs", "launch", "-d", "-n", name, "--infra", "aws/us-east-1",
                        f"{name}.yaml")
    assert result.returncode == 0, result.stderr
    found = re.search(r"Managed job (\d+) submitted", result.stderr)
    assert found, result.stderr
    return int(found.group(1))


def wait_status(daemon: Daemon, job_id: int, wanted: set[str], timeout: float
                ) -> dict[str, Any]:
    found: dict[str, Any] = {}

    def reached() -> bool:
        found.update(job(daemon, job_id))
        return found["status"] in wanted

    try:
        wait_for(reached, timeout, f"managed job {job_id} to be {wanted}", interval=1)
    except AssertionError as exc:
        raise AssertionError(f"{exc}; it is {found}\n{daemon.log()[-6000:]}") from None
    return found


def log_of(daemon: Daemon, job_id: int) -> str:
    result = daemon.ctl("jobs", "logs", str(job_id), "--no-follow")
    assert result.returncode in (0, 100, 101, 103), result.stderr
    return result.stdout


def instances_of(ec2: EC2Bed, cluster: str) -> list[dict[str, Any]]:
    """Every instance any launch of `cluster` made (each launch has a cloud name of its
    own; the cluster's name is a tag of all of them), terminated ones too."""
    return [i for i in ec2.aws()["instances"] if i["tags"].get("clusterd-cluster") == cluster]


def live(instances: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [i for i in instances if i["state"] != "terminated"]


def assert_nothing_left(ec2: EC2Bed, daemon: Daemon, cluster: str, *,
                        made_some: bool = True) -> None:
    assert daemon.cluster(cluster) is None
    made = instances_of(ec2, cluster)
    assert made or not made_some, f"no instance of {cluster} was ever made"
    for cloud_name in {i["tags"]["clusterd-cluster-name"] for i in made}:
        assert ec2.leftovers(cloud_name) == [], cloud_name


LONG_FIRST = """
resources:
  cpus: 2
  use_spot: true
run: |
  echo "task=$SKYPILOT_TASK_ID attempt=$SKYPILOT_MANAGED_JOB_ATTEMPT"
  if [ "$SKYPILOT_MANAGED_JOB_ATTEMPT" = 1 ]; then sleep 900; fi
  echo finished
"""


def test_a_preempted_spot_job_is_recovered_on_a_new_instance(ec2: EC2Bed,
                                                             daemon: Daemon) -> None:
    job_id = submit(daemon, LONG_FIRST, "spotty")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING", running_now
    cluster = running_now["cluster"]
    wait_for(lambda: "attempt=1" in log_of(daemon, job_id), 300, "attempt 1 to print",
             interval=1)
    (first,) = live(instances_of(ec2, cluster))
    preempted = ec2.testbed("preempt", first["id"])
    assert preempted.returncode == 0, preempted.stderr
    wait_status(daemon, job_id, {"RECOVERING"} | FINAL, 60)
    done = wait_status(daemon, job_id, FINAL, 900)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["recoveries"] == 1 and done["attempts"] == 2
    text = log_of(daemon, job_id)
    ids = re.findall(r"task=(\S+) attempt=(\d)", text)
    assert [a for _, a in ids] == ["1", "2"], text
    assert ids[0][0] == ids[1][0] == done["task_id"], text
    assert "attempt 1 on" in text and "attempt 2 on" in text and "recovering ===" in text
    assert text.rstrip().endswith("finished")
    instances = instances_of(ec2, cluster)
    assert len(instances) == 2 and first["id"] in {i["id"] for i in instances}
    assert_nothing_left(ec2, daemon, cluster)


FAILING = """
resources:
  cpus: 2
RECOVERY
run: |
  echo "attempt $SKYPILOT_MANAGED_JOB_ATTEMPT"
  exit 3
"""


@pytest.mark.parametrize(("recovery", "attempts"), [
    ("  job_recovery:\n    max_restarts_on_errors: 2", 3),
    ("", 1),
])
def test_a_user_failure_is_retried_only_as_asked(ec2: EC2Bed, daemon: Daemon, recovery: str,
                                                  attempts: int) -> None:
    job_id = submit(daemon, FAILING.replace("RECOVERY", recovery), f"fails{attempts}")
    cluster = job(daemon, job_id)["cluster"]
    done = wait_status(daemon, job_id, FINAL, 900)
    assert done["status"] == "FAILED", (done, daemon.log()[-4000:])
    assert done["attempts"] == attempts and done["user_restarts"] == attempts - 1
    assert done["recoveries"] == 0
    text = log_of(daemon, job_id)
    assert re.findall(r"^attempt (\d)$", text, re.M) == [str(n + 1) for n in range(attempts)]
    assert "exit code 3" in done["status_reason"]
    assert len(instances_of(ec2, cluster)) == 1  # retried in place, on the same cluster
    assert_nothing_left(ec2, daemon, cluster)


def test_cancel_while_running_leaves_nothing(ec2: EC2Bed, daemon: Daemon) -> None:
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: echo up; sleep 900\n", "cancelme")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING"
    cancelled = daemon.ctl("jobs", "cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    done = wait_status(daemon, job_id, FINAL, 300)
    assert done["status"] == "CANCELLED"
    logs = daemon.ctl("jobs", "logs", str(job_id))
    assert logs.returncode == 103 and "up" in logs.stdout
    assert_nothing_left(ec2, daemon, running_now["cluster"])


def test_down_of_a_managed_jobs_cluster_asks_to_cancel_the_job(daemon: Daemon) -> None:
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: sleep 900\n", "keepme")
    cluster = job(daemon, job_id)["cluster"]
    try:
        shown = wait_for(lambda: daemon.cluster(cluster), 600, f"cluster {cluster}", interval=1)
        assert shown["managed_job"] == job_id
        assert f"{cluster} (managed job {job_id})" in daemon.ctl("status").stdout
        refused = daemon.ctl("down", "-y", cluster)
        assert refused.returncode == 1
        assert f"jobs cancel {job_id}" in refused.stderr, refused.stderr
    finally:
        daemon.ctl("jobs", "cancel", str(job_id))
        wait_status(daemon, job_id, FINAL, 300)


def test_cancel_while_starting_leaves_nothing(ec2: EC2Bed, daemon: Daemon) -> None:
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: sleep 900\n", "early")
    cluster = job(daemon, job_id)["cluster"]
    wait_for(lambda: daemon.cluster(cluster), 600, f"cluster {cluster}", interval=0.2)
    assert job(daemon, job_id)["status"] == "STARTING"
    assert daemon.ctl("jobs", "cancel", str(job_id)).returncode == 0
    done = wait_status(daemon, job_id, FINAL, 300)
    assert done["status"] == "CANCELLED" and done["attempts"] == 0
    assert_nothing_left(ec2, daemon, cluster, made_some=False)


def preempt_without_capacity(ec2: EC2Bed, daemon: Daemon, name: str) -> tuple[int, str]:
    """A spot job RUNNING on aws/us-east-1, preempted while that region has no capacity:
    it is RECOVERING, saying why, with no instance."""
    job_id = submit(daemon, LONG_FIRST, name)
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING", running_now
    cluster = running_now["cluster"]
    (first,) = live(instances_of(ec2, cluster))
    ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances",
              "--region", "us-east-1")
    assert ec2.testbed("preempt", first["id"]).returncode == 0
    waiting = wait_status(daemon, job_id, {"RECOVERING"} | FINAL, 60)
    assert waiting["status"] == "RECOVERING"

    def says_why() -> bool:
        waiting.update(job(daemon, job_id))
        return "trying again" in waiting["status_reason"]

    wait_for(says_why, 120, "RECOVERING to say why it waits", interval=1)
    assert "InsufficientInstanceCapacity" in waiting["status_reason"], waiting
    assert live(instances_of(ec2, cluster)) == []
    return job_id, cluster


def test_recovery_waits_for_capacity_across_a_daemon_kill(ec2: EC2Bed, daemon: Daemon
                                                          ) -> None:
    try:
        job_id, cluster = preempt_without_capacity(ec2, daemon, "patient")
        daemon.kill()  # kill -9 while RECOVERING
        daemon.start()
        waiting = wait_status(daemon, job_id, {"RECOVERING"} | FINAL, 60)
        assert waiting["status"] == "RECOVERING"
    finally:
        ec2.clear_faults()
    done = wait_status(daemon, job_id, FINAL, 600)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    made = instances_of(ec2, cluster)
    assert len(made) == 2, made  # the preempted one and the one it recovered on
    assert re.findall(r"attempt=(\d)", log_of(daemon, job_id)) == ["1", "2"]
    assert_nothing_left(ec2, daemon, cluster)


def test_cancel_while_recovering_leaves_nothing(ec2: EC2Bed, daemon: Daemon) -> None:
    try:
        job_id, cluster = preempt_without_capacity(ec2, daemon, "giveup")
        assert daemon.ctl("jobs", "cancel", str(job_id)).returncode == 0
        done = wait_status(daemon, job_id, FINAL, 300)
        assert done["status"] == "CANCELLED"
    finally:
        ec2.clear_faults()
    assert len(instances_of(ec2, cluster)) == 1
    assert_nothing_left(ec2, daemon, cluster)


def test_a_daemon_killed_under_a_running_job_resumes_it(ec2: EC2Bed, daemon: Daemon) -> None:
    task = "resources:\n  cpus: 2\nrun: echo begun; sleep 25; echo ended\n"
    job_id = submit(daemon, task, "survivor")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING"
    wait_for(lambda: "begun" in log_of(daemon, job_id), 120, "the job to begin", interval=1)
    daemon.kill()
    daemon.start()
    done = wait_status(daemon, job_id, FINAL, 300)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["attempts"] == 1 and done["recoveries"] == 0
    text = log_of(daemon, job_id)
    assert text.count("begun") == 1 and text.count("ended") == 1, text
    assert len(instances_of(ec2, running_now["cluster"])) == 1  # one cluster, never two
    assert_nothing_left(ec2, daemon, running_now["cluster"])


def test_a_daemon_killed_while_tearing_down_a_lost_cluster_counts_one_recovery(
        ec2: EC2Bed, daemon: Daemon) -> None:
    """The loss is recorded (RECOVERING, one recovery) before the lost cluster's teardown;
    a daemon killed in that teardown finds the cluster's record still UP on restart, and
    must not count the same loss again when the cluster does not answer."""
    job_id = submit(daemon, LONG_FIRST, "lostonce")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING", running_now
    wait_for(lambda: "attempt=1" in log_of(daemon, job_id), 300, "attempt 1 to print",
             interval=1)
    daemon.kill()
    daemon.start({"CLUSTERD_TEST_FAULTS": "down.mid_teardown"})
    (first,) = live(instances_of(ec2, running_now["cluster"]))
    assert ec2.testbed("preempt", first["id"]).returncode == 0
    process = daemon.process
    assert process is not None
    wait_for(lambda: process.poll() is not None, 120, "the daemon to die in the teardown")
    daemon.start()
    done = wait_status(daemon, job_id, FINAL, 900)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["recoveries"] == 1 and done["attempts"] == 2, done
    text = log_of(daemon, job_id)
    assert text.count("recovering ===") == 1, text
    assert re.findall(r"attempt=(\d)", text) == ["1", "2"], text
    assert_nothing_left(ec2, daemon, running_now["cluster"])
