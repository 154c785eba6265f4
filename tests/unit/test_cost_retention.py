"""The ledger's retention on a real state database: closed intervals of torn-down clusters
that ended before the bound go; open intervals and a live cluster's past stay; the report
totals what remains, and the sums the ledger keeps in memory shrink with the table."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from clusterctl.protocol import ClusterStatus
from clusterd.cost.ledger import Ledger
from clusterd.cost.prices import Prices
from clusterd.managed.store import ManagedJobStore
from clusterd.providers.base import Placement
from clusterd.providers.ssh_pools import Pool
from clusterd.services.cost import CostService
from clusterd.state import ClusterRecord, ClusterStore, Database
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from clusterd.user_config import UserConfig

pytestmark = pytest.mark.anyio

DAY = 86400.0
NOW = time.time()
BOUND = NOW - 400 * DAY


def record(name: str, created_at: float, owner: str | None = None) -> ClusterRecord:
    return ClusterRecord(
        name=name, provider="ssh", cloud_name=f"{name}-1", status=ClusterStatus.UP,
        num_nodes=1, requested_resources=ResourceRequest(Resources(Infra("ssh"))),
        config_hash="x", created_at=created_at, status_updated_at=created_at,
        launched_resources=Placement("ssh", "rack", None, None, 2, 8), owner=owner)


@pytest.fixture
async def ledger(db: Database) -> Ledger:
    # $1 per host-hour: a day of one node is $24.
    book = Ledger(db, Prices(lambda: UserConfig(Path("config.yaml")),
                             lambda: {"rack": Pool("rack", (), price_per_hour=1.0)}))
    await book.load()
    return book


async def test_prunes_the_old_keeps_the_open_and_the_recent(db: Database, ledger: Ledger) -> None:
    old = record("old", NOW - 500 * DAY, owner="managed-job:1")
    await ledger.running(old, at=old.created_at)
    await ledger.ended("old", at=NOW - 499 * DAY)  # torn down 499 days ago: $24, goes
    recent = record("recent", NOW - 10 * DAY)
    await ledger.running(recent, at=recent.created_at)
    await ledger.ended("recent", at=NOW - 9 * DAY)  # torn down 9 days ago: $24, stays
    # A live cluster made 600 days ago: its first day (closed long ago) is its cost so far.
    live = record("live", NOW - 600 * DAY)
    store = ClusterStore(db)
    await store.insert(live, "made", None)
    await ledger.running(live, at=live.created_at)
    await ledger.stopped(live, at=NOW - 599 * DAY)  # its disks: free on an ssh pool
    # A record gone while the daemon was down: its interval open until refresh closes it.
    lost = record("lost", NOW - 450 * DAY)
    await ledger.running(lost, at=lost.created_at)
    await ledger.ended("lost", at=NOW - 449 * DAY)
    await ledger.running(record("lost", NOW - 430 * DAY), at=NOW - 430 * DAY)
    live_cost = ledger.cost_so_far(live, now=NOW)

    assert await ledger.prune(BOUND) == 2  # old's interval, lost's first one
    assert await ledger.prune(BOUND) == 0  # again: nothing more
    left = await db.fetchall("SELECT cluster, incarnation FROM cost_intervals ORDER BY id")
    assert [(r["cluster"], r["incarnation"]) for r in left] == [
        ("recent", recent.created_at), ("live", live.created_at), ("live", live.created_at),
        ("lost", NOW - 430 * DAY)]
    assert ledger.cost_so_far(live, now=NOW) == pytest.approx(live_cost) == pytest.approx(24)
    assert ledger.owner_cost("managed-job:1") == 0.0  # its sum went with its intervals

    report = await CostService(ledger, db, None, ManagedJobStore(db)).report(3650)
    totals = {c["name"]: c["cost"] for c in report["clusters"]}
    assert set(totals) == {"recent", "live", "lost"}
    assert totals["recent"] == pytest.approx(24) and totals["live"] == pytest.approx(24)
    assert report["total"] == pytest.approx(sum(totals.values()))

    reloaded = Ledger(db, Prices(lambda: UserConfig(Path("config.yaml")), dict))
    await reloaded.load()  # what a restart sees is what the pruned ledger held
    assert reloaded.cost_so_far(live, now=NOW) == pytest.approx(24)
    assert reloaded.open_intervals("lost")[0].started_at == NOW - 430 * DAY
