"""The cost ledger on the EC2 test bed (issue 39 §1, §4), against the bed's own records: each
instance's LaunchTime (moved by a start, as EC2 does) and the time its StateTransitionReason
gives for a stop, a termination or a spot interruption, read from the API by the test and
never from the daemon. With the catalog's real prices: a 2-node spot cluster's node-seconds;
a daemon killed -9 mid-way (nothing lost, nothing counted twice, and an instance terminated
while it was down closed at the termination, not at the restart); a budget of a fraction of
a cent that stops a running cluster and refuses the next launch; a preempted managed job's
recovery cost."""

from __future__ import annotations

import csv
import datetime
import itertools
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.e2e.ec2bed import REGIONS, EC2Bed, cloud_name, running
from tests.e2e.test_cost_local import report
from tests.e2e.test_failover import task
from tests.e2e.test_managed_jobs import (
    FINAL,
    LONG_FIRST,
    first_attempt_running,
    instances_of,
    live,
    managed_jobs_daemon,
    submit,
    wait_status,
)
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.timeout(1800)]

CATALOG = Path(__file__).resolve().parents[2] / "daemon/clusterd/providers/aws/data/vms.csv"
TOLERANCE = 0.01  # issue 39 §4: the report within 1 % of the bed's records
# Each instance of a cluster (by its cloud name), as the API tells it now.
RECORDS = """
import json, boto3
out = []
for region in REGIONS.split(","):
    ec2 = boto3.client("ec2", region_name=region)
    pages = ec2.describe_instances(Filters=[
        {"Name": "tag:clusterd-cluster-name", "Values": [CLOUD]}])["Reservations"]
    for i in (i for r in pages for i in r["Instances"]):
        out.append({"id": i["InstanceId"], "state": i["State"]["Name"],
                    "type": i["InstanceType"], "region": region,
                    "launched": i["LaunchTime"].timestamp(),
                    "reason": i.get("StateTransitionReason") or ""})
print(json.dumps(out))
"""


def records(ec2: EC2Bed, cloud: str) -> dict[str, dict[str, Any]]:
    """The cluster's instances by id, from the API (the bed's moto)."""
    code = RECORDS.replace("REGIONS", repr(REGIONS)).replace("CLOUD", repr(cloud))
    return {i["id"]: i for i in json.loads(ec2.python(code))}


def told_at(reason: str) -> float:
    """The time in a StateTransitionReason: "User initiated (2026-12-06 17:20:01 UTC)"."""
    inside = reason[reason.index("(") + 1:reason.index(")")]
    stamp, _zone = inside.rsplit(" ", 1)
    return datetime.datetime.strptime(stamp, "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=datetime.UTC).timestamp()


class Lifetimes:
    """A cluster's node-seconds by the bed's records, read at each change the test makes:
    every start (launch, start) from the instances' LaunchTime, every end (stop, down,
    termination) from their StateTransitionReason."""

    def __init__(self, ec2: EC2Bed, cloud: str) -> None:
        self._ec2, self._cloud = ec2, cloud
        self.spans: dict[str, list[tuple[float, float | None]]] = {}

    def started(self) -> None:
        for iid, rec in records(self._ec2, self._cloud).items():
            assert rec["state"] == "running", rec
            self.spans.setdefault(iid, []).append((rec["launched"], None))

    def ended(self, ids: set[str] | None = None) -> dict[str, float]:
        found = {}
        for iid, rec in records(self._ec2, self._cloud).items():
            if ids is not None and iid not in ids:
                continue
            assert rec["state"] in ("stopped", "terminated"), rec
            start, end = self.spans[iid][-1]
            assert end is None, (iid, self.spans)
            found[iid] = told_at(rec["reason"])
            self.spans[iid][-1] = (start, found[iid])
        return found

    def node_seconds(self) -> float:
        total = 0.0
        for start, end in itertools.chain.from_iterable(self.spans.values()):
            assert end is not None
            total += end - start
        return total


def entry(daemon: Daemon, name: str) -> dict[str, Any]:
    (found,) = [c for c in report(daemon)["clusters"] if c["name"] == name]
    return found


def running_seconds(cluster: dict[str, Any]) -> float:
    """The report's node-seconds of running (each closed interval's length times nodes)."""
    total = 0.0
    for interval in cluster["intervals"]:
        assert interval["ended_at"] is not None, cluster
        if interval["kind"] == "running":
            total += (interval["ended_at"] - interval["started_at"]) * interval["nodes"]
    return total


def assert_one_after_another(cluster: dict[str, Any]) -> None:
    """No second in two intervals of the cluster."""
    for a, b in itertools.pairwise(cluster["intervals"]):
        assert a["ended_at"] is not None and b["started_at"] >= a["ended_at"], cluster


def catalog_prices(instance_type: str, region: str, spot: bool) -> set[float]:
    with CATALOG.open() as f:
        return {float(row["SpotPrice" if spot else "Price"]) for row in csv.DictReader(f)
                if row["InstanceType"] == instance_type and row["Region"] == region
                and row["SpotPrice" if spot else "Price"]}


def assert_priced_from_the_catalog(cluster: dict[str, Any], rec: dict[str, Any],
                                   spot: bool) -> None:
    """Every running interval at the catalog's price of the instances' type and region,
    and the cluster's cost what its intervals make at their prices."""
    prices = catalog_prices(rec["type"], rec["region"], spot)
    assert prices, rec
    cost = 0.0
    for interval in cluster["intervals"]:
        rate = interval["disk_price_per_hour"] + (
            interval["node_price_per_hour"] if interval["kind"] == "running" else 0.0)
        cost += rate * interval["nodes"] * (interval["ended_at"] - interval["started_at"]) / 3600
        if interval["kind"] == "running":
            assert interval["node_price_per_hour"] in prices, (interval, prices)
    assert cluster["cost"] == pytest.approx(cost, rel=TOLERANCE, abs=1e-6), cluster


def assert_matches(cluster: dict[str, Any], bed: Lifetimes) -> None:
    wanted, counted = bed.node_seconds(), running_seconds(cluster)
    assert wanted > 0 and abs(counted - wanted) <= TOLERANCE * wanted, (counted, wanted,
                                                                         bed.spans, cluster)


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdca-")) as daemon:
        yield daemon


def launch(daemon: Daemon, name: str, text: str) -> None:
    (daemon.root / f"{name}.yaml").write_text(text)
    result = daemon.ctl("launch", "-c", name, "--infra", "aws/us-east-1", f"{name}.yaml",
                        timeout=900)
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]


def ctl_ok(daemon: Daemon, *args: str) -> None:
    result = daemon.ctl(*args, timeout=600)
    assert result.returncode == 0, result.stderr + daemon.log()[-3000:]


def test_a_2_node_spot_clusters_report_matches_its_node_lifetimes(ec2: EC2Bed,
                                                                   daemon: Daemon) -> None:
    launch(daemon, "spot", task(ec2, "  use_spot: true\nnum_nodes: 2\n"))
    cloud = cloud_name(daemon, "spot")
    bed = Lifetimes(ec2, cloud)
    bed.started()
    assert len(bed.spans) == 2
    ctl_ok(daemon, "exec", "spot", "--", "sleep 15")
    # A spot instance cannot be stopped (clusterd refuses, as SkyPilot does): its life is
    # launch to down.
    refused = daemon.ctl("stop", "-y", "spot")
    assert refused.returncode != 0 and "spot" in refused.stderr, refused.stderr
    ctl_ok(daemon, "down", "-y", "spot")
    bed.ended()
    cluster = entry(daemon, "spot")
    assert [i["kind"] for i in cluster["intervals"]] == ["running"]
    assert cluster["intervals"][0]["nodes"] == 2 and not cluster["live"]
    assert_matches(cluster, bed)
    assert_priced_from_the_catalog(cluster, next(iter(records(ec2, cloud).values())),
                                   spot=True)
    assert [j["job_id"] for j in cluster["split"]["jobs"]] == [1, 2]
    assert ec2.leftovers(cloud) == []


def test_kill_9_mid_way_loses_no_second_and_counts_none_twice(ec2: EC2Bed,
                                                              daemon: Daemon) -> None:
    launch(daemon, "kept", task(ec2, "num_nodes: 2\n"))
    launch(daemon, "lost", task(ec2))
    kept, lost = cloud_name(daemon, "kept"), cloud_name(daemon, "lost")
    bed = Lifetimes(ec2, kept)
    bed.started()
    (lost_id,) = records(ec2, lost)
    daemon.kill()  # SIGKILL, both clusters running: their intervals stay open
    # While the daemon is away, one cluster's instance is terminated through the API.
    ec2.ec2_call("us-east-1", "terminate_instances", InstanceIds=[lost_id])
    terminated = told_at(records(ec2, lost)[lost_id]["reason"])
    restarted = time.time()
    daemon.start()
    ctl_ok(daemon, "status", "--refresh")
    assert daemon.cluster("lost") is None
    gone = entry(daemon, "lost")
    (interval,) = gone["intervals"]
    # Closed at the provider's termination time (to its second), not at the restart.
    assert interval["ended_at"] == terminated < restarted, (interval, terminated, restarted)

    ctl_ok(daemon, "stop", "-y", "kept")
    bed.ended()
    ctl_ok(daemon, "start", "kept")
    bed.started()
    ctl_ok(daemon, "down", "-y", "kept")
    bed.ended()
    cluster = entry(daemon, "kept")
    # One running interval through the restart (not closed and opened again), then the
    # stopped one, then the second run.
    assert [i["kind"] for i in cluster["intervals"]] == ["running", "stopped", "running"]
    assert_one_after_another(cluster)
    assert_matches(cluster, bed)
    assert_priced_from_the_catalog(cluster, next(iter(records(ec2, kept).values())),
                                   spot=False)
    assert ec2.leftovers(kept) == [] and ec2.leftovers(lost) == []


def test_a_budget_of_a_fraction_of_a_cent_stops_the_cluster_and_refuses_launches(
        ec2: EC2Bed, tmp_path: Path) -> None:
    config = yaml.safe_load(Path(ec2.env["CLUSTERD_CONFIG"]).read_text()) or {}
    config["budget"] = {"monthly": 0.001, "action": "stop"}
    config_file = tmp_path / "config.yaml"
    config_file.write_text(yaml.safe_dump(config))
    with running(ec2.daemon("cdcb-", CLUSTERD_CONFIG=str(config_file),
                            CLUSTERD_BUDGET_POLL="2")) as daemon:
        launch(daemon, "spender", task(ec2))
        cloud = cloud_name(daemon, "spender")
        # Running on-demand at cents per hour, it passes $0.001 within a minute or two.
        wait_for(lambda: (daemon.cluster("spender") or {}).get("status") == "STOPPED", 600,
                 "the budget to stop the cluster", interval=2)
        # Stopped (EC2 can stop an on-demand instance), not terminated: its disk is kept.
        assert {r["state"] for r in records(ec2, cloud).values()} == {"stopped"}
        events = daemon.ctl("events", "spender").stdout
        assert "budget" in events, events
        (daemon.root / "next.yaml").write_text(task(ec2))
        refused = daemon.ctl("launch", "-c", "next", "--infra", "aws/us-east-1", "next.yaml",
                             timeout=300)
        assert refused.returncode != 0
        assert "monthly budget of $0.001 is exceeded" in refused.stderr, refused.stderr
        assert f"budget.monthly in {config_file}" in refused.stderr, refused.stderr
        assert not any(i["tags"].get("clusterd-cluster") == "next"
                       for i in ec2.aws()["instances"])
        spent = report(daemon)["total"]
        assert spent >= 0.001, spent


def test_a_preempted_managed_jobs_report_names_its_recovery_cost(ec2: EC2Bed) -> None:
    with managed_jobs_daemon(ec2, "cdcm-") as daemon:
        job_id = submit(daemon, LONG_FIRST, "recover")
        cluster = first_attempt_running(daemon, job_id)["cluster"]
        (first,) = live(instances_of(ec2, cluster))
        cloud = first["tags"]["clusterd-cluster-name"]
        preempted = ec2.testbed("preempt", first["id"])
        assert preempted.returncode == 0, preempted.stderr
        done = wait_status(daemon, job_id, FINAL, 900)
        assert done["status"] == "SUCCEEDED" and done["recoveries"] == 1, done
        rec = records(ec2, cloud)[first["id"]]
        assert rec["reason"].startswith("Service initiated"), rec
        # The preempted attempt: from its instance's launch to the interruption.
        attempt_s = told_at(rec["reason"]) - rec["launched"]
        full = report(daemon)
        (job,) = [j for j in full["managed_jobs"] if j["job_id"] == job_id]
        # Its attempts are incarnations of one cluster name: the first is the preempted one.
        attempt, _ = sorted((c for c in full["clusters"] if c["name"] == cluster),
                            key=lambda c: c["incarnation"])
        assert attempt["owner"] == f"managed-job:{job_id}", attempt
        (interval,) = attempt["intervals"]
        assert interval["node_price_per_hour"] in catalog_prices(rec["type"], rec["region"],
                                                                 spot=True)
        rate = interval["node_price_per_hour"] + interval["disk_price_per_hour"]
        wanted = rate * attempt_s / 3600
        assert job["attempts"] == 2 and job["recoveries"] > 0, job
        assert abs(job["recoveries"] - wanted) <= TOLERANCE * wanted, (job, wanted, attempt)
        assert job["cost"] > job["recoveries"], job
