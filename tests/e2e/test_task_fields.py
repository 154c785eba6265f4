"""SkyPilot task fields end to end on local clusters: warnings for fields without effect (in
the output and as events), --strict refusing them, and docker:IMAGE jobs run in a container
by the node's container runtime (podman here, with an image made from a busybox rootfs)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import Daemon, busybox_image, running_daemon

pytestmark = pytest.mark.ray

IMAGE = "localhost/clusterd-test:1"


def test_fields_without_effect_are_warned_and_refused_under_strict(
        shared_daemon: Daemon, local_cluster: str) -> None:
    task = shared_daemon.root / "warned.yaml"
    task.write_text("resources:\n  job_recovery: none\n  disk_tier: high\nrun: echo ran\n")
    result = shared_daemon.ctl("launch", "-c", "warned", "--infra", "local", str(task))
    try:
        assert result.returncode == 0, result.stderr
        assert "ran" in result.stdout
        assert "warning: resources.job_recovery: has no effect: how a managed job recovers" in (
            result.stderr)
        assert "warning: resources.disk_tier: has no effect on local" in result.stderr
        events = json.loads(shared_daemon.ctl("events", "warned", "--json").stdout)
        assert {e["reason"].split(":")[0] for e in events if e["kind"] == "warning"} == {
            "resources.job_recovery", "resources.disk_tier"}
        # exec says it too.
        exec_task = shared_daemon.root / "exec-warned.yaml"
        exec_task.write_text("resources:\n  network_tier: best\nrun: echo again\n")
        again = shared_daemon.ctl("exec", "warned", str(exec_task))
        assert again.returncode == 0 and "warning: resources.network_tier" in again.stderr
    finally:
        shared_daemon.ctl("down", "-y", "warned")
    strict = shared_daemon.ctl("launch", "-c", "strict", "--strict", str(task))
    assert strict.returncode == 1 and "[INVALID_TASK]" in strict.stderr
    assert "resources.job_recovery: has no effect" in strict.stderr
    assert shared_daemon.cluster("strict") is None
    # Only a provider-bound field: strict refuses that provider, naming the field.
    tier = shared_daemon.root / "tier.yaml"
    tier.write_text("resources:\n  infra: local\n  disk_tier: high\nrun: echo x\n")
    refused = shared_daemon.ctl("launch", "-c", "tier", "--strict", str(tier))
    assert refused.returncode == 1
    assert "resources.disk_tier: has no effect on local" in refused.stderr
    assert "(refused: strict)" in refused.stderr


def _job_ids(daemon: Daemon, cluster: str) -> set[int]:
    listed = daemon.ctl("queue", cluster, "--json")
    assert listed.returncode == 0, listed.stderr
    return {job["job_id"] for job in json.loads(listed.stdout)}


def test_exec_checks_the_task_against_its_cluster_as_launch_does(
        shared_daemon: Daemon, local_cluster: str, tmp_path: Path) -> None:
    """What launch says of a task on a provider, exec says on a cluster of that provider:
    a warning for a field without effect there, a refusal under --strict (or `strict: true`)
    or for what the cluster cannot give (more nodes, accelerators, another provider), and
    then the job never runs."""
    marker = tmp_path / "ran"
    task = tmp_path / "tier.yaml"
    task.write_text(f"resources:\n  disk_tier: best\nrun: touch {marker}; echo ran\n")
    warned = shared_daemon.ctl("exec", local_cluster, str(task))
    assert warned.returncode == 0 and warned.stdout == "ran\n", warned.stderr
    assert "warning: resources.disk_tier: has no effect on local" in warned.stderr
    events = json.loads(shared_daemon.ctl("events", local_cluster, "--json").stdout)
    assert any(e["kind"] == "warning" and e["reason"].startswith("resources.disk_tier")
               for e in events)
    marker.unlink()
    before = _job_ids(shared_daemon, local_cluster)
    refused = shared_daemon.ctl("exec", local_cluster, "--strict", str(task))
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "[CLUSTER_MISMATCH]" in refused.stderr
    assert "resources.disk_tier: has no effect on local" in refused.stderr
    assert "(refused: strict)" in refused.stderr and "hint:" in refused.stderr
    config = Path(shared_daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "config.yaml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text("strict: true\n")
    try:
        by_config = shared_daemon.ctl("exec", local_cluster, str(task))
        assert by_config.returncode == 1 and "(refused: strict)" in by_config.stderr
    finally:
        config.unlink()
    # What the cluster does not have, it cannot give; a task meant for another provider is
    # not for this cluster.
    gpu = tmp_path / "gpu.yaml"
    gpu.write_text(f"resources:\n  accelerators: A100:1\nrun: touch {marker}\n")
    aws = tmp_path / "aws.yaml"
    aws.write_text(f"resources:\n  infra: aws\nrun: touch {marker}\n")
    for args, said in (((str(gpu),), "asks for A100:1"),
                       (("--num-nodes", "2", "--", f"touch {marker}"), "asks for 2 nodes"),
                       ((str(aws),), f"cluster {local_cluster} runs on local, not aws")):
        mismatch = shared_daemon.ctl("exec", local_cluster, *args)
        assert mismatch.returncode == 1, (args, mismatch.stderr)
        assert said in mismatch.stderr and "hint:" in mismatch.stderr, mismatch.stderr
    assert _job_ids(shared_daemon, local_cluster) == before
    assert not marker.exists()


def test_a_machine_image_cannot_apply_to_local_and_says_so(shared_daemon: Daemon) -> None:
    task = shared_daemon.root / "ami.yaml"
    task.write_text("resources:\n  infra: local\n  image_id: ami-0123456789\nrun: echo x\n")
    refused = shared_daemon.ctl("launch", "-c", "ami", str(task))
    assert refused.returncode == 1
    assert "resources.image_id: cannot apply on local" in refused.stderr


@pytest.fixture(scope="module")
def podman() -> Iterator[dict[str, str]]:
    """A container runtime that works here, and a small image of its own: busybox, and a file
    saying where it is."""
    with busybox_image(IMAGE, files={"etc/clusterd-test-image": "inside the image\n"}) as env:
        yield env


def test_a_docker_image_runs_the_job_in_that_container(podman: dict[str, str]) -> None:
    with running_daemon("cdimg-") as daemon:
        daemon.stop()
        daemon.env.update(podman)
        daemon.start()
        workdir = daemon.root / "wd"
        workdir.mkdir()
        (workdir / "data.txt").write_text("synced\n")
        task = daemon.root / "box.yaml"
        task.write_text(f"resources:\n  image_id: docker:{IMAGE}\nworkdir: wd\n"
                        "secrets:\n  TOKEN:\n"
                        "run: |\n  cat /etc/clusterd-test-image\n  cat data.txt\n"
                        "  echo rank=$SKYPILOT_NODE_RANK token=$TOKEN\n")
        result = daemon.ctl("launch", "-c", "box", str(task), "--secret", "TOKEN=t0k3n")
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert result.stdout.splitlines() == ["inside the image", "synced", "rank=0 token=t0k3n"]
        # Without the image the same job runs on the node itself.
        plain = daemon.ctl("exec", "box", "--", "test -e /etc/clusterd-test-image || echo host")
        assert plain.stdout.strip() == "host"
