"""Chaos on the EC2 test bed: launches of 1-2 node clusters under random fault rules, half of
them with the daemon SIGKILLed at a random point and restarted, then resumed or torn down; at
the end `down` of everything. Not one instance or security group may be left, and every
record ever created must be accounted for.

Seeded and reproducible: CLUSTERD_CHAOS_SEED (default below), CLUSTERD_CHAOS_LAUNCHES (12 in
the whole suite, to keep it inside CI's budget; run alone with 30 or more).
Run alone with `pytest -m chaos`.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from collections.abc import Iterator

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.e2e.test_failover import task
from tests.support import Daemon

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.chaos]

SEED = int(os.environ.get("CLUSTERD_CHAOS_SEED", "20261130"))
LAUNCHES = int(os.environ.get("CLUSTERD_CHAOS_LAUNCHES", "12"))
KILL_POINTS = ("launch.before_create", "launch.after_create", "launch.waiting",
               "launch.during_install", "launch.after_agent")
# (code, what it may be scoped to) — every rule fires a limited number of times.
FAULTS = (
    ("InsufficientInstanceCapacity", "zone"),
    ("InsufficientInstanceCapacity", "zone"),
    ("Unsupported", "zone"),
    ("VcpuLimitExceeded", "region"),
    ("MaxSpotInstanceCountExceeded", "region"),
    ("RequestLimitExceeded", None),
    ("InternalError", None),
    ("hang", None),
)
ZONES = ("us-east-1a", "us-east-1b", "us-east-1c", "us-west-2a")
REGIONS = ("us-east-1", "us-west-2")


@pytest.fixture(scope="module")
def chaos(ec2: EC2Bed) -> Iterator[Daemon]:
    config = ec2.dir / "chaos.yaml"
    # Short API timeouts: a hanging call ends in seconds, not the default 30 s per try.
    config.write_text("aws:\n  vpc_name: clusterd-testbed\n  use_internal_ips: true\n"
                      "  request_timeout: 2\n")
    daemon = ec2.daemon("cdch-", CLUSTERD_CONFIG=str(config))
    with running(daemon):
        yield daemon


def random_rules(rng: random.Random, ec2: EC2Bed) -> int:
    rules = 0
    for _ in range(rng.choice((0, 1, 1, 2))):
        code, scope = rng.choice(FAULTS)
        if code == "hang":  # one call that takes effect and never answers
            args = ["--code", "InternalError", "--hang", "--count", "1"]
        else:
            args = ["--code", code, "--count", str(rng.randint(1, 4))]
        args += ["--action", "RunInstances"]
        if scope == "zone":
            args += ["--zone", rng.choice(ZONES)]
        elif scope == "region":
            args += ["--region", rng.choice(REGIONS)]
        ec2.fault(*args)
        rules += 1
    return rules


@pytest.mark.timeout(3600)
def test_chaos_leaves_nothing_behind(ec2: EC2Bed, chaos: Daemon) -> None:
    rng = random.Random(SEED)
    started = time.monotonic()
    figures = {"launches": 0, "killed": 0, "resumed": 0, "downed_after_kill": 0,
               "landed": 0, "failed": 0, "rules": 0}
    names: list[str] = []
    for index in range(LAUNCHES):
        name = f"chaos{index}"
        names.append(name)
        nodes = rng.choice((1, 2))
        figures["rules"] += random_rules(rng, ec2)
        (chaos.root / f"{name}.yaml").write_text(task(ec2).replace(
            "resources:", f"num_nodes: {nodes}\nresources:"))
        kill = rng.random() < 0.5
        point = rng.choice(KILL_POINTS)
        if kill:
            chaos.stop()
            chaos.start({"CLUSTERD_TEST_FAULTS": point})
        figures["launches"] += 1
        result = chaos.ctl("launch", "-c", name, "--infra", "aws", f"{name}.yaml",
                           timeout=900)
        ec2.clear_faults()
        if kill:
            assert chaos.process is not None
            if chaos.process.poll() is not None:
                figures["killed"] += 1
            chaos.stop()
            chaos.start()
            if chaos.cluster(name) is not None:
                if rng.random() < 0.5:
                    figures["resumed"] += 1
                    result = chaos.ctl("launch", "-c", name, f"{name}.yaml", timeout=900)
                else:
                    figures["downed_after_kill"] += 1
        figures["landed" if result.returncode == 0 else "failed"] += 1
        print(f"chaos {index}: {nodes} node(s), kill at {point if kill else '-'}: "
              f"{'landed' if result.returncode == 0 else 'failed'} "
              f"({time.monotonic() - started:.0f} s)", file=sys.stderr, flush=True)
        # At most a couple of clusters alive at once: the bed's nodes share this machine.
        for old in names[:-1]:
            if chaos.cluster(old) is not None:
                done = chaos.ctl("down", "-y", old, timeout=600)
                assert done.returncode == 0, f"{old}: {done.stderr}"
    for name in names:
        if chaos.cluster(name) is not None:
            done = chaos.ctl("down", "-y", name, timeout=600)
            assert done.returncode == 0, f"{name}: {done.stderr}"

    managed_by = (chaos.state_dir / "daemon-id").read_text().strip()
    state = ec2.aws()
    ours = [i for i in state["instances"] if i["tags"].get("clusterd-managed-by") == managed_by]
    alive = [i["id"] for i in ours if i["state"] != "terminated"]
    groups = [g["id"] for g in state["groups"]
              if g["tags"].get("clusterd-managed-by") == managed_by]
    events = json.loads(chaos.ctl("events", "--json", "-n", "10000").stdout)
    ended = {e["cluster"] for e in events if e["to_status"] == "TERMINATED"}
    started_records = {e["cluster"] for e in events if e["from_status"] is None
                       and e["kind"] == "status"}
    figures.update(instances_created=len(ours), instances_left=len(alive),
                   security_groups_left=len(groups), records=len(started_records),
                   records_unaccounted=len(started_records - ended),
                   seconds=round(time.monotonic() - started))
    print(f"\nchaos (seed {SEED}): {json.dumps(figures)}")
    assert alive == [] and groups == []
    assert chaos.ctl("status", "--json").stdout.strip() == "[]"
    assert started_records <= ended, started_records - ended
