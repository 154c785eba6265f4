"""The cost of a two-node cluster on an ssh pool with `price_per_hour` (issue 39): the report's
cost is price x nodes x the hours its nodes were held, within the bounds the test measured
around launch and down; the launch says the pool's $/h before it takes the hosts, and
`max_hourly_cost` under the pool's price refuses the launch naming the pool and its price.
The idle-cost guard warns of a priced cluster left idle with no autostop, until it gets one."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.e2e.cost_bounds import assert_held_between, reported
from tests.e2e.sshbed import Bed, ssh_bed
from tests.support import wait_for

pytestmark = pytest.mark.ray

PRICE = 36.0  # dollars per host and hour: a cent a second, so seconds show


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(2) as made:
        made.price_pool(PRICE)
        made.daemon.stop()  # the idle-cost guard looks every second, not every 30 s
        made.daemon.start(extra_env={"CLUSTERD_IDLE_WARNING_CHECK": "1"})
        yield made


def config_file(bed: Bed) -> Path:
    return Path(bed.daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "config.yaml"


def test_a_pool_clusters_cost_is_price_times_nodes_times_hours(bed: Bed) -> None:
    ctl = bed.daemon.ctl
    before_launch = time.time()
    launch = ctl("launch", "-c", "priced", "--infra", "ssh/testbed", "--num-nodes", "2",
                 "--", "echo hi", timeout=900)
    assert launch.returncode == 0, launch.stderr + bed.daemon.log()[-3000:]
    launched = time.time()
    said = " ".join((launch.stdout + launch.stderr).split())
    assert "creating nodes on ssh/testbed, $72/h for the cluster" in said, said
    status = json.loads(ctl("status", "--json").stdout)
    (priced,) = [c for c in status if c["name"] == "priced"]
    assert priced["cost_per_hour"] == pytest.approx(2 * PRICE)
    before_down = time.time()
    assert ctl("down", "-y", "priced", timeout=300).returncode == 0
    downed = time.time()

    report, row = reported(ctl, "priced")
    assert row["sources"] == ["ssh pool testbed price_per_hour"]
    rate = 2 * PRICE / 3600
    assert_held_between(row, 2 * PRICE, before_down - launched, downed - before_launch)
    (interval,) = row["intervals"]
    assert row["cost"] == pytest.approx(
        rate * (interval["ended_at"] - interval["started_at"]), rel=1e-6)
    assert report["providers"] == [{"provider": "ssh", "cost": row["cost"]}]


def test_a_cap_under_the_pools_price_refuses_naming_it(bed: Bed, tmp_path: Path) -> None:
    task = tmp_path / "capped.yaml"
    task.write_text(yaml.safe_dump({"resources": {"infra": "ssh/testbed",
                                                  "max_hourly_cost": PRICE / 2},
                                    "run": "true"}))
    refused = bed.daemon.ctl("launch", "-c", "dear", str(task), timeout=300)
    assert refused.returncode != 0
    text = " ".join(refused.stderr.split())
    assert (f"every place costs more than ${PRICE / 2:g} per node and hour; the cheapest is "
            f"ssh/testbed at ${PRICE:g} per node and hour") in text, refused.stderr
    plan = json.loads(bed.daemon.ctl("launch", "--dryrun", "--json", "-c", "dear",
                                     "--infra", "ssh/testbed", "--", "true").stdout)
    assert plan["placement"]["price_per_hour"] == PRICE
    assert plan["placement"]["price_source"] == "ssh pool testbed price_per_hour"


def test_an_idle_cluster_with_no_autostop_is_warned_of_until_it_has_one(bed: Bed) -> None:
    ctl = bed.daemon.ctl
    config_file(bed).write_text(yaml.safe_dump({"cost": {"idle_warning_after": "3s"}}))
    try:
        launch = ctl("launch", "-c", "idler", "--infra", "ssh/testbed", "--", "true",
                     timeout=900)
        assert launch.returncode == 0, launch.stderr + bed.daemon.log()[-3000:]
        wait_for(lambda: "cluster idler has been idle for" in ctl("status").stderr, 120,
                 "the idle-cost notice")
        said = " ".join(ctl("status").stderr.split())
        assert "with no autostop, at $36/h: $" in said, said
        assert "set one: clusterctl autostop idler -i 30" in said, said
        events = ctl("events", "idler").stdout
        assert "idle-cost" in events and "has been idle for" in events, events
        # ssh hosts are not ours to stop: the autostop tears down.
        assert ctl("autostop", "idler", "-i", "60", "--down").returncode == 0
        assert "idler has been idle" not in ctl("status").stderr
    finally:
        config_file(bed).write_text("")
        ctl("down", "-y", "idler", timeout=300)
