"""Pure helpers of the job runner (clusterd.agent.runner); Ray is imported, never started."""

from __future__ import annotations

import json
import subprocess
import sys

import psutil
import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent import node_spawn
from clusterd.agent.jobs_db import Job
from clusterd.agent.runner import NodeSlot, describe_exit, skypilot_env
from tests.support import wait_for


def make_job(**fields: object) -> Job:
    values: dict[str, object] = {
        "job_id": 4,
        "name": "train",
        "user": "alice",
        "status": JobStatus.RUNNING,
        "submitted_at": 1000.0,
        "spec": {"cluster_name": "dev"},
        "has_secrets": False,
        "resources_display": "2x[CPU:1]",
        "num_nodes": 2,
        "task_id": "sky-2024-01-01-00-00-00-000000_dev_4",
    }
    values.update(fields)
    return Job(**values)  # type: ignore[arg-type]


SLOTS = [
    NodeSlot(rank=0, bundle_index=0, node_id="n0", ip="10.0.0.1"),
    NodeSlot(rank=1, bundle_index=1, node_id="n1", ip="10.0.0.2"),
    NodeSlot(rank=2, bundle_index=2, node_id="n2", ip="10.0.0.3"),
]


@pytest.mark.parametrize(
    ("code", "text"),
    [
        (139, "a segmentation fault (exit code 139)"),
        (137, "killed (SIGKILL) (exit code 137)"),
        (143, "terminated (SIGTERM) (exit code 143)"),
        (130, "interrupted (SIGINT) (exit code 130)"),
        (134, "aborted (SIGABRT) (exit code 134)"),
        (3, "exit code 3"),
        (1, "exit code 1"),
    ],
)
def test_describe_exit(code: int, text: str) -> None:
    assert describe_exit(code) == text


def test_describe_exit_segfault_mentions_segmentation_fault() -> None:
    assert "segmentation fault" in describe_exit(139)
    assert "segmentation fault" not in describe_exit(3)


def test_node_slot_labels() -> None:
    assert SLOTS[0].label == "(head, rank=0)"
    assert SLOTS[2].label == "(worker2, rank=2)"


def test_skypilot_env_for_run() -> None:
    job = make_job(num_nodes=3, spec={"cluster_name": "dev", "cloud": "AWS",
                                      "region": "us-east-1", "zone": "us-east-1a"})
    env = skypilot_env(job, SLOTS, 1, phase="run", gpus_per_node=2.0)
    assert env["SKYPILOT_NODE_RANK"] == "1"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2\n10.0.0.3"
    assert env["SKYPILOT_NUM_NODES"] == "3"
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "2"
    assert env["SKYPILOT_TASK_ID"] == "sky-2024-01-01-00-00-00-000000_dev_4"
    # SkyPilot's keys, which task files read (`jq .cloud`, `cluster_info["region"]`).
    assert json.loads(env["SKYPILOT_CLUSTER_INFO"]) == {
        "cluster_name": "dev", "cloud": "AWS", "region": "us-east-1", "zone": "us-east-1a",
        "num_nodes": 3}
    assert env["SKYPILOT_USER"] == "alice"
    assert "SKYPILOT_SETUP_NODE_RANK" not in env
    assert "SKYPILOT_SETUP_NODE_IPS" not in env


def test_skypilot_env_for_setup_sets_setup_names_too() -> None:
    env = skypilot_env(make_job(), SLOTS[:2], 0, phase="setup", gpus_per_node=0)
    assert env["SKYPILOT_SETUP_NODE_RANK"] == "0"
    assert env["SKYPILOT_SETUP_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["SKYPILOT_NODE_RANK"] == "0"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1\n10.0.0.2"
    assert env["SKYPILOT_NUM_NODES"] == "2"
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "0"


def test_skypilot_env_fractional_gpus_and_single_node() -> None:
    env = skypilot_env(make_job(spec={}), SLOTS[:1], 0, phase="run", gpus_per_node=0.5)
    assert env["SKYPILOT_NUM_GPUS_PER_NODE"] == "0.5"
    assert env["SKYPILOT_NODE_IPS"] == "10.0.0.1"
    assert env["SKYPILOT_NUM_NODES"] == "1"
    assert json.loads(env["SKYPILOT_CLUSTER_INFO"]) == {
        "cluster_name": "", "cloud": None, "region": None, "zone": None, "num_nodes": 1}


def test_kill_tagged_processes_finds_a_job_by_its_environment() -> None:
    import os
    import select

    from clusterd.agent.node_tasks import JOB_TAG, kill_tagged_processes

    def spawn(tag: str) -> subprocess.Popen[bytes]:
        # A session of its own, as a daemonized child of a job would have; `cat` echoes.
        return subprocess.Popen(["cat"], env={**os.environ, JOB_TAG: tag},
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                start_new_session=True)

    mine, other = spawn("sky-test_job_1"), spawn("sky-test_job_2")
    try:
        assert kill_tagged_processes("sky-test_job_1") == 1
        assert mine.wait(10) is not None
        # Another job's process is left alone: it still echoes. A signal sent to it before
        # kill_tagged_processes returned would be acted on before its read of this returns.
        assert other.stdin is not None and other.stdout is not None
        other.stdin.write(b"still here\n")
        other.stdin.flush()
        assert select.select([other.stdout], [], [], 10)[0], "no echo in 10 s"
        assert other.stdout.readline() == b"still here\n"
        assert other.poll() is None
    finally:
        for process in (mine, other):
            process.kill()
            process.communicate()


def test_status_names_the_address_a_running_head_really_serves() -> None:
    """A head whose record lost its ports is recognised by its own command line."""
    argv = [sys.executable, "-c", "import time; time.sleep(60)", "--head",
            "--node-ip-address=127.9.9.9", "--port=6399"]
    head = subprocess.Popen(argv)
    worker = subprocess.Popen([*argv[:3], "--address=127.9.9.9:6399"])
    try:
        wait_for(lambda: "--head" in psutil.Process(head.pid).cmdline(), 10, "the head")
        wait_for(lambda: len(psutil.Process(worker.pid).cmdline()) > 3, 10, "the worker")
        assert node_spawn.head_address(psutil.Process(head.pid)) == "127.9.9.9:6399"
        assert node_spawn.head_address(psutil.Process(worker.pid)) is None
    finally:
        for process in (head, worker):
            process.kill()
            process.wait(timeout=10)
