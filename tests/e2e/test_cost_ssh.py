"""The cost of a two-node cluster on an ssh pool with `price_per_hour` (issue 39): the report's
cost is price x nodes x the hours its nodes were held, within the bounds the test measured
around launch and down."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator

import pytest

from tests.e2e.sshbed import Bed, ssh_bed

pytestmark = pytest.mark.ray

PRICE = 36.0  # dollars per host and hour: a cent a second, so seconds show


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(2) as made:
        made.price_pool(PRICE)
        yield made


def test_a_pool_clusters_cost_is_price_times_nodes_times_hours(bed: Bed) -> None:
    ctl = bed.daemon.ctl
    before_launch = time.time()
    launch = ctl("launch", "-c", "priced", "--infra", "ssh/testbed", "--num-nodes", "2",
                 "--", "echo hi", timeout=900)
    assert launch.returncode == 0, launch.stderr + bed.daemon.log()[-3000:]
    launched = time.time()
    status = json.loads(ctl("status", "--json").stdout)
    (priced,) = [c for c in status if c["name"] == "priced"]
    assert priced["cost_per_hour"] == pytest.approx(2 * PRICE)
    before_down = time.time()
    assert ctl("down", "-y", "priced", timeout=300).returncode == 0
    downed = time.time()

    report = json.loads(ctl("cost-report", "--json").stdout)
    (row,) = [c for c in report["clusters"] if c["name"] == "priced"]
    assert row["sources"] == ["ssh pool testbed price_per_hour"]
    rate = 2 * PRICE / 3600
    # Held at least from the launch's end to down's start, at most from launch to down's end.
    assert rate * (before_down - launched) <= row["cost"] <= rate * (downed - before_launch)
    (interval,) = row["intervals"]
    assert row["cost"] == pytest.approx(
        rate * (interval["ended_at"] - interval["started_at"]), rel=1e-6)
    assert report["providers"] == [{"provider": "ssh", "cost": row["cost"]}]
