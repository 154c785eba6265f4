"""EC2 throttling under load, on the EC2 test bed: while three clusters launch at once, its API
endpoint answers a share of all calls with RequestLimitExceeded, and a burst of RunInstances
calls (twelve in a row: more than botocore's five tries of one call, so that without clusterd's
own patience two launches would fail), and every launch still succeeds, saying it was
throttled."""

from __future__ import annotations

import concurrent.futures
import json
import subprocess
from collections.abc import Iterator

import pytest

from tests.e2e.ec2bed import EC2Bed, cloud_name, running
from tests.support import Daemon

# Each launch gets less time than the test, so that a launch stuck on CI fails with the
# daemon's log (what it waited on), not with a stack of the test's threads.
pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(900)]
LAUNCH_TIMEOUT_S = 420

CLUSTERS = ("thr1", "thr2", "thr3")


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdthr-")) as started:
        yield started


def test_concurrent_launches_ride_out_throttling(ec2: EC2Bed, daemon: Daemon) -> None:
    burst = ec2.fault("--code", "RequestLimitExceeded", "--action", "RunInstances",
                      "--count", "12")
    rule = ec2.fault("--code", "RequestLimitExceeded", "--share", "0.3")
    try:
        def launch(name: str) -> subprocess.CompletedProcess[str]:
            try:
                return daemon.ctl("launch", "-c", name, "--infra", "aws/us-east-1", "--cpus",
                                  "2", "--", f"echo {name} ran", timeout=LAUNCH_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                bed_log = (ec2.dir / "controller.log").read_text(errors="replace")
                pytest.fail(f"launch of {name} still running after {LAUNCH_TIMEOUT_S} s; the "
                            f"daemon's log ends:\n{daemon.log()[-12000:]}\nthe bed's log "
                            f"ends:\n{bed_log[-8000:]}\nthe nodes' logs:\n"
                            f"{ec2.node_logs()}")

        with concurrent.futures.ThreadPoolExecutor(len(CLUSTERS)) as pool:
            results = dict(zip(CLUSTERS, pool.map(launch, CLUSTERS), strict=True))
        rules = json.loads(ec2.testbed("fault", "list", "--json").stdout)["rules"]
        fired = {r["id"]: r["fired"] for r in rules}
    finally:
        ec2.clear_faults()
    for name, result in results.items():
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert f"{name} ran" in result.stdout
    assert fired[burst] == 12 and fired[rule] >= 10  # it did throttle, often
    told = "".join(r.stderr for r in results.values())
    assert "throttled by EC2 (" in told and "retrying in " in told
    for name in CLUSTERS:
        on_cloud = cloud_name(daemon, name)
        assert daemon.ctl("down", "-y", name, timeout=600).returncode == 0
        assert ec2.leftovers(on_cloud) == []
