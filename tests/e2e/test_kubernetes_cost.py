"""What a pod costs on the Kubernetes test bed with `kubernetes.pricing` (issue 39): the
placement carries the price of the pod's requests, so the launch says the cluster's $/h
before it makes the pod, `--dryrun` says it with its source, and the cost report of a
cluster held for a measured time is price x the hours its pod ran, within the bounds the
test measured around launch and down."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.e2e.cost_bounds import assert_held_between, reported
from tests.e2e.k8sbed import K8sBed
from tests.support import Daemon, running

pytestmark = [pytest.mark.k8s, pytest.mark.ray]

CPU_PER_HOUR = 360.0  # dollars per CPU requested and hour: large, so seconds show
MEMORY_PER_HOUR = 36.0  # per GiB requested and hour
POD = 0.5 * CPU_PER_HOUR + 1 * MEMORY_PER_HOUR  # the task's pod: 0.5 CPU, 1 GB: $216/h
CONFIG = f"""
kubernetes:
  allowed_contexts: [bed-a]
  image: {{image}}
  image_pull_policy: Never
  provision_timeout: 5
  pricing: {{{{cpu_per_hour: {CPU_PER_HOUR}, memory_gib_per_hour: {MEMORY_PER_HOUR}}}}}
"""
TASK = """
resources:
  infra: kubernetes/bed-a
  cpus: 0.5
  memory: 1
run: echo priced
"""


@pytest.fixture(scope="module")
def daemon(k8s: K8sBed) -> Iterator[Daemon]:
    with running(k8s.daemon("cdk8c-", CONFIG.format(image=k8s.image))) as d:
        yield d


def test_a_pods_price_is_said_at_launch_and_counted_in_the_report(daemon: Daemon) -> None:
    ctl = daemon.ctl
    (daemon.root / "priced.yaml").write_text(TASK)
    plan = json.loads(ctl("launch", "--dryrun", "--json", "-c", "pod", "priced.yaml").stdout)
    assert plan["placement"]["price_per_hour"] == pytest.approx(POD)
    assert plan["placement"]["price_source"] == "kubernetes.pricing"

    before_launch = time.time()
    launch = ctl("launch", "-c", "pod", "priced.yaml", timeout=900)
    assert launch.returncode == 0, launch.stderr + daemon.log()[-4000:]
    launched = time.time()
    said = " ".join((launch.stdout + launch.stderr).split())
    assert f"${POD:g}/h for the cluster" in said, said
    before_down = time.time()
    assert ctl("down", "-y", "pod", timeout=300).returncode == 0
    downed = time.time()

    _, row = reported(ctl, "pod")
    assert row["sources"] == ["kubernetes.pricing"]
    assert_held_between(row, POD, before_down - launched, downed - before_launch)
