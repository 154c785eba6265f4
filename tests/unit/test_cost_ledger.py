"""The cost ledger against a real state database: intervals opened and closed by the hooks,
idempotent hooks, spend and burn rate, and an open interval that survives kill -9."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from clusterctl.protocol import ClusterStatus
from clusterd.cost.attribution import by_day, by_day_and_provider
from clusterd.cost.ledger import RUNNING, STOPPED, Ledger
from clusterd.cost.prices import Prices
from clusterd.nodes import NodeInfo, NodeStatus
from clusterd.providers.base import Placement
from clusterd.providers.ssh_pools import Pool
from clusterd.state import ClusterRecord, Database
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from clusterd.user_config import UserConfig

pytestmark = pytest.mark.anyio

HOUR = 3600.0
T0 = 1_000_000.0


def prices() -> Prices:
    pools = {"rack": Pool("rack", (), price_per_hour=2.0)}
    return Prices(lambda: UserConfig(Path("config.yaml")), lambda: pools)


def record(name: str = "dev", nodes: int = 2, created_at: float = T0,
           provider: str = "ssh") -> ClusterRecord:
    placed = Placement(provider, "rack" if provider == "ssh" else "us-east-1",
                       None, None if provider == "ssh" else "m5.large", 2, 8,
                       price_per_hour=0.0 if provider == "ssh" else 0.096)
    return ClusterRecord(
        name=name, provider=provider, cloud_name=f"{name}-1", status=ClusterStatus.UP,
        num_nodes=nodes, requested_resources=ResourceRequest(Resources(Infra(provider))),
        config_hash="x", created_at=created_at, status_updated_at=created_at,
        launched_resources=placed)


@pytest.fixture
async def ledger(db: Database) -> Ledger:
    book = Ledger(db, prices())
    await book.load()
    return book


async def test_running_then_stopped_then_down_counts_each_stretch(ledger: Ledger) -> None:
    dev = record()
    await ledger.running(dev, at=T0)
    await ledger.running(dev, at=T0 + 60)  # again (a repair, a retried hook): no change
    assert [i.started_at for i in ledger.open_intervals("dev")] == [T0]
    await ledger.stopped(dev, at=T0 + HOUR)
    await ledger.ended("dev", at=T0 + 3 * HOUR)
    # 2 nodes x $2/h x 1 h running; an ssh host has no disk price while stopped.
    assert await ledger.spend(0, T0 + 10 * HOUR) == pytest.approx(4.0)
    assert ledger.cost_so_far(dev, now=T0 + 10 * HOUR) == pytest.approx(4.0)
    assert await ledger.spenders() == []
    assert await ledger.burn_rate() == 0.0


async def test_spend_clips_to_the_window_and_open_ones_accrue(ledger: Ledger) -> None:
    dev = record()
    await ledger.running(dev, at=T0)
    assert await ledger.spend(T0 + HOUR, T0 + 2 * HOUR) == pytest.approx(4.0)
    assert await ledger.spend(T0 - HOUR, T0) == 0.0
    assert await ledger.burn_rate() == pytest.approx(4.0)
    assert await ledger.burn_rate("aws") == 0.0
    assert await ledger.spenders("ssh") == ["dev"]
    assert await ledger.spend(T0 + HOUR, T0 + 2 * HOUR, provider="aws") == 0.0


async def test_aws_disks_cost_while_stopped(ledger: Ledger) -> None:
    box = record("box", nodes=1, provider="aws")
    await ledger.running(box, at=T0)
    await ledger.stopped(box, at=T0 + HOUR)
    [stopped] = ledger.open_intervals("box")
    assert stopped.kind == STOPPED and stopped.source == "catalog on-demand"
    # 256 GB at $0.08 per GB-month, by the hour.
    disk = 256 * 0.08 / 730
    assert stopped.rate == pytest.approx(disk)
    assert await ledger.spend(0, T0 + 2 * HOUR) == pytest.approx(0.096 + 2 * disk)


async def test_a_lost_node_splits_the_interval(ledger: Ledger) -> None:
    dev = record()
    await ledger.running(dev, at=T0)
    one_left = [NodeInfo("a", "10.0.0.1", NodeStatus.RUNNING),
                NodeInfo("b", "10.0.0.2", NodeStatus.TERMINATED)]
    await ledger.observed(dev, one_left)
    [now] = ledger.open_intervals("dev")
    assert now.nodes == 1 and now.kind == RUNNING
    await ledger.observed(dev, [NodeInfo("a", "10.0.0.1", NodeStatus.TERMINATED)])
    assert ledger.open_intervals("dev") == []


async def test_a_cluster_made_again_is_counted_apart(ledger: Ledger) -> None:
    first, second = record(created_at=T0), record(created_at=T0 + 10 * HOUR)
    await ledger.running(first, at=T0)
    await ledger.ended("dev", at=T0 + HOUR)
    await ledger.running(second, at=T0 + 10 * HOUR)
    assert ledger.cost_so_far(second, now=T0 + 10.5 * HOUR) == pytest.approx(2.0)
    assert ledger.cost_so_far(first) == pytest.approx(4.0)


async def test_an_open_interval_survives_kill_9(db: Database, ledger: Ledger,
                                                tmp_path: Path) -> None:
    dev = record()
    await ledger.running(dev, at=T0)
    # Another process opening the file now sees what a daemon killed here would leave.
    with sqlite3.connect(tmp_path / "state.db") as conn:
        rows = conn.execute("SELECT kind, started_at, ended_at FROM cost_intervals").fetchall()
    assert rows == [("running", T0, None)]
    await db.close()
    again = Database(tmp_path / "state.db")
    await again.open()
    try:
        revived = Ledger(again, prices())
        await revived.load()
        await revived.running(dev, at=T0 + HOUR)  # refresh finds it still running: no new one
        await revived.observed(dev, [])  # ... and later gone
        rows2 = await again.fetchall("SELECT started_at, ended_at FROM cost_intervals")
        assert [(r["started_at"], r["ended_at"] is not None) for r in rows2] == [(T0, True)]
    finally:
        await again.close()


async def test_one_open_interval_per_cluster_and_kind_is_enforced(db: Database) -> None:
    row = ("dev", T0, "dev-1", "ssh", "ssh/rack", None, 1, "running", T0, None, 1.0, 0.0, "x")
    insert = ("INSERT INTO cost_intervals (cluster, incarnation, cloud_name, provider, infra,"
              " instance_type, nodes, kind, started_at, ended_at, node_price_per_hour,"
              " disk_price_per_hour, source) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
    await db.write([(insert, row)])
    with pytest.raises(sqlite3.IntegrityError):
        await db.write([(insert, row)])


async def test_a_managed_jobs_cost_sums_its_clusters(db: Database, ledger: Ledger) -> None:
    import dataclasses

    first = dataclasses.replace(record(), owner="managed-job:3")
    await ledger.running(first, at=T0)
    await ledger.ended("dev", at=T0 + HOUR)
    second = dataclasses.replace(record(created_at=T0 + 2 * HOUR), owner="managed-job:3")
    await ledger.running(second, at=T0 + 2 * HOUR)
    assert ledger.owner_cost("managed-job:3", now=T0 + 3 * HOUR) == pytest.approx(8.0)
    revived = Ledger(db, prices())
    await revived.load()
    assert revived.owner_cost("managed-job:3", now=T0 + 3 * HOUR) == pytest.approx(8.0)


async def test_spend_by_day_in_sql_is_by_day(ledger: Ledger) -> None:
    """The report's days summed in SQL cut intervals at UTC midnights, per provider, as
    attribution.by_day_and_provider does: stretches over one, over several, and one still
    open, clipped to the window, on two providers."""
    midnight = 1_700_006_400.0  # a UTC midnight
    for name, start, end, provider in (("a", midnight - 2 * HOUR, midnight + HOUR, "ssh"),
                                       ("b", midnight + 5 * HOUR, midnight + 50 * HOUR, "aws"),
                                       ("c", midnight - 30 * HOUR, None, "ssh")):
        await ledger.running(record(name, created_at=start, provider=provider), at=start)
        if end is not None:
            await ledger.ended(name, at=end)
    now, since = midnight + 60 * HOUR, midnight - 10 * HOUR
    expected = by_day_and_provider(await ledger.intervals(since), now, since)
    got = await ledger.spend_by_day(since, now)
    assert list(got) == list(expected) == ["2023-11-14", "2023-11-15", "2023-11-16",
                                           "2023-11-17"]
    assert got == {day: {provider: pytest.approx(dollars) for provider, dollars in p.items()}
                   for day, p in expected.items()}
    assert set(got["2023-11-15"]) == {"aws", "ssh"} and set(got["2023-11-14"]) == {"ssh"}
    assert by_day(await ledger.intervals(since), now, since) == pytest.approx(
        {day: sum(p.values()) for day, p in got.items()})
