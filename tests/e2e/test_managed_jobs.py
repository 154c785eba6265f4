"""Managed jobs end to end on the EC2 test bed (moto's API, real sshd nodes, real Ray and
agents, the daemon as controller), through clusterctl: recovery from a spot preemption,
user failures with and without restarts, cancel, and a daemon killed under a running job.
Every test also checks that no instance or security group is left."""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(1500)]

IMAGES = "CLUSTERD_TESTBED_RUNTIME_IMAGES"
FINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS",
         "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"}


@contextlib.contextmanager
def managed_jobs_daemon(ec2: EC2Bed, prefix: str, **env: str) -> Iterator[Daemon]:
    """A daemon in the bed for managed jobs, on the bed's runtime image (IMAGES: read by
    `submit`, not by the daemon), so no launch waits for a runtime install; its jobs are
    cancelled at the end (their clusters are theirs: `down` refuses them)."""
    with running(ec2.daemon(prefix, CLUSTERD_RETRY_GAP="2", CLUSTERD_RETRY_MAX_GAP="5",
                            **{IMAGES: json.dumps(ec2.runtime_images())}, **env)) as daemon:
        try:
            yield daemon
        finally:
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.ctl("jobs", "cancel", "--all")
                wait_for(lambda: not queue(daemon), 300, "every managed job to end")


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with managed_jobs_daemon(ec2, "cdmj-", CLUSTERD_AGENT_AUTOSTOP_GRACE="5") as daemon:
        yield daemon


def queue(daemon: Daemon, *, all: bool = False) -> list[dict[str, Any]]:
    result = daemon.ctl("jobs", "queue", "--json", *(["--all"] if all else []))
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def job(daemon: Daemon, job_id: int) -> dict[str, Any]:
    return next(j for j in queue(daemon, all=True) if j["job_id"] == job_id)


def on_runtime_image(daemon: Daemon, task: str) -> str:
    """The task on the bed's runtime image, when the bed has one."""
    images: dict[str, str] = json.loads(daemon.env.get(IMAGES) or "{}")
    return task.replace("resources:\n", "resources:\n  image_id:\n" + "".join(
        f"    {region}: {ami}\n" for region, ami in images.items()), 1) if images else task


def submit(daemon: Daemon, task: str, name: str, infra: str = "aws/us-east-1") -> int:
    (daemon.root / f"{name}.yaml").write_text(on_runtime_image(daemon, task))
    result = daemon.ctl("jobs", "launch", "-d", "-n", name, "--infra", infra, f"{name}.yaml")
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


def first_attempt_running(daemon: Daemon, job_id: int) -> dict[str, Any]:
    """The job's record once it is RUNNING and its first attempt has printed (LONG_FIRST's
    `attempt=1`): its run has begun on its cluster."""
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING", running_now
    wait_for(lambda: "attempt=1" in log_of(daemon, job_id), 300, "attempt 1 to print",
             interval=1)
    return running_now


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


@pytest.mark.parametrize("strategy", ["FAILOVER", "EAGER_NEXT_REGION"])
def test_a_preempted_spot_job_recovers_where_its_strategy_says(
        ec2: EC2Bed, daemon: Daemon, strategy: str) -> None:
    """Preempted while the zone it ran in has no spot capacity left: FAILOVER (the default)
    relaunches in the same region, another zone; EAGER_NEXT_REGION in another region."""
    task = LONG_FIRST if strategy == "FAILOVER" else LONG_FIRST.replace(
        "  use_spot: true\n", f"  use_spot: true\n  job_recovery:\n    strategy: {strategy}\n")
    job_id = submit(daemon, task, strategy.lower()[:5], infra="aws")
    cluster = first_attempt_running(daemon, job_id)["cluster"]
    (first,) = live(instances_of(ec2, cluster))
    region = first["region"]
    try:
        ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances",
                  "--zone", first["zone"])
        preempted = ec2.testbed("preempt", first["id"])
        assert preempted.returncode == 0, preempted.stderr
        wait_status(daemon, job_id, {"RECOVERING"} | FINAL, 60)
        done = wait_status(daemon, job_id, FINAL, 900)
    finally:
        ec2.clear_faults()
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
    second = next(i for i in instances if i["id"] != first["id"])
    if strategy == "FAILOVER":
        assert second["region"] == region and second["zone"] != first["zone"], second
    else:
        assert second["region"] != region, second
    assert str(done["infra"]).startswith(f"aws/{second['region']}"), done
    assert_nothing_left(ec2, daemon, cluster)


def test_down_is_refused_and_cancel_while_running_leaves_nothing(ec2: EC2Bed,
                                                                 daemon: Daemon) -> None:
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: echo up; sleep 900\n", "cancelme")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 600)
    assert running_now["status"] == "RUNNING"
    cluster = running_now["cluster"]
    shown = daemon.cluster(cluster)
    assert shown is not None and shown["managed_job"] == job_id
    assert f"{cluster} (managed job {job_id})" in daemon.ctl("status").stdout
    # The cluster is the job's: `down` asks for a cancel instead.
    refused = daemon.ctl("down", "-y", cluster)
    assert refused.returncode == 1
    assert f"jobs cancel {job_id}" in refused.stderr, refused.stderr
    wait_for(lambda: "up" in log_of(daemon, job_id), 120, "the job to print", interval=1)
    cancelled = daemon.ctl("jobs", "cancel", str(job_id))
    assert cancelled.returncode == 0, cancelled.stderr
    done = wait_status(daemon, job_id, FINAL, 300)
    assert done["status"] == "CANCELLED"
    logs = daemon.ctl("jobs", "logs", str(job_id))
    assert logs.returncode == 103 and "up" in logs.stdout
    assert_nothing_left(ec2, daemon, cluster)


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


class LiveInstances:
    """The most instances of one cluster alive at once, sampled every second in a thread
    while the test runs: a job must never have two clusters."""

    def __init__(self, ec2: EC2Bed, cluster: str) -> None:
        self.most = 0
        self._ec2, self._cluster = ec2, cluster
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(1.0):
            self.most = max(self.most, len(live(instances_of(self._ec2, self._cluster))))

    def __enter__(self) -> LiveInstances:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


def test_a_partitioned_worker_of_a_two_node_job_is_recovered(ec2: EC2Bed,
                                                            daemon: Daemon) -> None:
    task = ("num_nodes: 2\nresources:\n  cpus: 2\nrun: |\n"
            "  echo \"rank=$SKYPILOT_NODE_RANK attempt=$SKYPILOT_MANAGED_JOB_ATTEMPT\"\n"
            "  if [ \"$SKYPILOT_MANAGED_JOB_ATTEMPT\" = 1 ]; then sleep 900; fi\n")
    job_id = submit(daemon, task, "pair")
    running_now = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 900)
    assert running_now["status"] == "RUNNING", (running_now, daemon.log()[-6000:])
    cluster = running_now["cluster"]
    wait_for(lambda: log_of(daemon, job_id).count("attempt=1") == 2, 300,
             "both ranks of attempt 1 to print", interval=1)
    nodes = live(instances_of(ec2, cluster))
    assert len(nodes) == 2
    worker = next(n for n in nodes if n["tags"]["clusterd-node-role"] == "worker")
    with LiveInstances(ec2, cluster) as sampled:
        cut_at = time.monotonic()
        assert ec2.testbed("partition", worker["id"]).returncode == 0
        try:
            recovering = wait_status(daemon, job_id, {"RECOVERING"} | FINAL, 120)
            seen_after = time.monotonic() - cut_at
            assert recovering["status"] == "RECOVERING", recovering
            # The daemon's own SSH connection to the worker says so (control/links.py),
            # well before Ray's health checks would (about a minute).
            assert seen_after <= 30, (seen_after, recovering)
            assert "SSH" in recovering["status_reason"], recovering
            done = wait_status(daemon, job_id, FINAL, 900)
        finally:
            ec2.testbed("heal", worker["id"])  # gone by now, or back for its teardown
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["recoveries"] == 1, done
    assert sampled.most <= 2, "the job had two clusters at once"
    assert sorted(re.findall(r"rank=(\d) attempt=2", log_of(daemon, job_id))) == ["0", "1"]
    # The lost cluster was discarded (its instances terminated) without reaching its nodes
    # first: the partitioned worker's SSH never held the teardown up. (The new cluster's
    # nodes may refuse a first connection while they boot: that retry is the launch's.)
    controller = daemon.ctl("jobs", "logs", str(job_id), "--controller", "--no-follow")
    assert "teardown of" not in controller.stdout, controller.stdout
    lines = controller.stdout.splitlines()
    lost_at = next(i for i, line in enumerate(lines) if "RUNNING -> RECOVERING" in line)
    lost_nodes = set(re.findall(r"ssh connected\s+node=(\S+)", "\n".join(lines[:lost_at])))
    assert len(lost_nodes) == 2, controller.stdout
    retried = set(re.findall(r"ssh connect failed\S*;? retrying\s+node=(\S+)",
                             controller.stdout))
    assert not lost_nodes & retried, controller.stdout
    assert_nothing_left(ec2, daemon, cluster)


def test_a_daemon_killed_while_the_job_starts_ends_it_with_one_cluster(
        ec2: EC2Bed, daemon: Daemon) -> None:
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: echo once\n", "restart")
    cluster = job(daemon, job_id)["cluster"]
    with LiveInstances(ec2, cluster) as sampled:
        # Killed once its instance exists and before the job runs on it.
        wait_for(lambda: live(instances_of(ec2, cluster)), 600, "the job's instance",
                 interval=0.5)
        assert job(daemon, job_id)["status"] == "STARTING"
        daemon.kill()
        daemon.start()
        done = wait_status(daemon, job_id, FINAL, 600)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["attempts"] == 1 and log_of(daemon, job_id).count("once") == 1
    assert sampled.most == 1, "the job had two clusters at once"
    assert_nothing_left(ec2, daemon, cluster)


def test_a_job_whose_first_launch_keeps_failing_fails_its_prechecks(ec2: EC2Bed,
                                                                   daemon: Daemon) -> None:
    # Not capacity: an error no other place mends, so the job does not wait forever.
    ec2.fault("--code", "InvalidParameterCombination", "--action", "RunInstances")
    try:
        job_id = submit(daemon, "resources:\n  cpus: 2\nrun: echo never\n", "refused")
        done = wait_status(daemon, job_id, FINAL, 300)
    finally:
        ec2.clear_faults()
    assert done["status"] == "FAILED_PRECHECKS", done
    assert "InvalidParameterCombination" in done["status_reason"]
    assert "failed 3 times" in done["status_reason"] and done["attempts"] == 0
    assert_nothing_left(ec2, daemon, done["cluster"], made_some=False)


def test_daemon_kills_under_a_running_job_lose_nothing(ec2: EC2Bed, daemon: Daemon) -> None:
    """Killed and started again at once: the job goes on where it was. Killed, and the job
    ends while no daemon runs: the next daemon sees it ended and tears its cluster down."""
    # /var/tmp is the host's in the bed's nodes (their /tmp is their own): the job's end can
    # be seen here while no daemon runs.
    mark = Path(tempfile.mkdtemp(prefix="cdmj-done-", dir="/var/tmp"))
    mark.chmod(0o1777)
    try:
        task = (f"resources:\n  cpus: 2\nrun: |\n  echo begun\n"
                f"  while [ ! -e {mark}/go ]; do sleep 0.2; done\n"
                f"  echo ended\n  touch {mark}/ended\n")
        job_id = submit(daemon, task, "survivor")
        wait_for(lambda: "begun" in log_of(daemon, job_id), 600, "the job to begin",
                 interval=0.5)
        cluster = job(daemon, job_id)["cluster"]
        # A launch may have failed over before the job began (a slow node on a loaded
        # machine): what the kills must not do is make another.
        made_before = {i["id"] for i in instances_of(ec2, cluster)}
        daemon.kill()
        daemon.start()
        assert wait_status(daemon, job_id, {"RUNNING"} | FINAL, 60)["status"] == "RUNNING"
        daemon.kill()
        (mark / "go").touch()
        wait_for(lambda: (mark / "ended").exists(), 120, "the job to end with no daemon")
        daemon.start()
        done = wait_status(daemon, job_id, FINAL, 300)
    finally:
        shutil.rmtree(mark, ignore_errors=True)
    if done["status"] != "SUCCEEDED" or done["attempts"] != 1 or done["recoveries"] != 0:
        # Whole, where pytest shows it (an assertion's message is cut short): what the
        # controller saw, the end of the daemons' log, and what the bed did to its nodes.
        view = daemon.ctl("jobs", "logs", "--controller", str(job_id), "--no-follow").stdout
        bed_log = ec2.dir / "controller.log"
        nodes = bed_log.read_text()[-20000:] if bed_log.exists() else "(none)"
        print(f"{done}\n--- controller's view\n{view}\n--- daemon log\n"
              f"{daemon.log()[-30000:]}\n--- the bed's controller log\n{nodes}")
    assert done["status"] == "SUCCEEDED"
    assert done["attempts"] == 1 and done["recoveries"] == 0
    text = log_of(daemon, job_id)
    assert text.count("begun") == 1 and text.count("ended") == 1, text
    made = {i["id"] for i in instances_of(ec2, cluster)}
    assert made == made_before, (made - made_before, daemon.log()[-6000:])
    assert_nothing_left(ec2, daemon, cluster)



def test_a_daemon_killed_while_tearing_down_a_lost_cluster_counts_one_recovery(
        ec2: EC2Bed, daemon: Daemon) -> None:
    """The loss is recorded (RECOVERING, one recovery) before the lost cluster's teardown;
    a daemon killed in that teardown finds the cluster's record still UP on restart, and
    must not count the same loss again when the cluster does not answer."""
    job_id = submit(daemon, LONG_FIRST, "lostonce")
    running_now = first_attempt_running(daemon, job_id)
    daemon.kill()
    daemon.start({"CLUSTERD_TEST_FAULTS": "down.mid_teardown"})
    (first,) = live(instances_of(ec2, running_now["cluster"]))
    assert ec2.testbed("preempt", first["id"]).returncode == 0
    daemon.wait_killed_at_fault_point(120)  # in the teardown
    daemon.start()
    done = wait_status(daemon, job_id, FINAL, 900)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["recoveries"] == 1 and done["attempts"] == 2, done
    text = log_of(daemon, job_id)
    assert text.count("recovering ===") == 1, text
    assert re.findall(r"attempt=(\d)", text) == ["1", "2"], text
    assert_nothing_left(ec2, daemon, running_now["cluster"])


def test_a_daemon_killed_while_submitting_resumes_with_one_attempt(ec2: EC2Bed,
                                                                   daemon: Daemon) -> None:
    """kill -9 in the first submission (its marker is in the log, the record has no
    attempt yet): on restart the same attempt is submitted again, with one marker."""
    daemon.kill()
    daemon.start({"CLUSTERD_TEST_FAULTS": "exec.during_submit"})
    job_id = submit(daemon, "resources:\n  cpus: 2\nrun: echo begun; sleep 3; echo ended\n",
                    "submitonce")
    cluster = job(daemon, job_id)["cluster"]
    daemon.wait_killed_at_fault_point(600)  # in the submission
    daemon.start()
    done = wait_status(daemon, job_id, FINAL, 600)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert done["attempts"] == 1 and done["recoveries"] == 0, done
    text = log_of(daemon, job_id)
    assert text.count("attempt 1 on") == 1, text
    assert text.count("begun") == 1 and text.count("ended") == 1, text
    assert len(instances_of(ec2, cluster)) == 1
    assert_nothing_left(ec2, daemon, cluster)
