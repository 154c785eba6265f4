"""Settled splits on a real state database and real kept copies: a torn-down incarnation
whose inputs are final is settled once and the report reads it (so it outlives the events
and kept copies it was made from); one torn down too lately, or whose kept copy is not
closed out, is split anew; a window that starts mid-life splits anew; retention forgets a
settled split with its intervals."""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest

from clusterctl.protocol import ClusterStatus
from clusterd.cost.ledger import Ledger
from clusterd.cost.prices import Prices
from clusterd.cost.report import Window, build
from clusterd.keptlogs.store import Caps, KeptCluster, KeptJob, KeptLogStore
from clusterd.managed.store import ManagedJobStore
from clusterd.providers.base import Placement
from clusterd.providers.ssh_pools import Pool
from clusterd.services.cost import DAY, CostService
from clusterd.state import ClusterRecord, Database
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from clusterd.user_config import UserConfig

pytestmark = pytest.mark.anyio

H = 3600.0
T0 = time.time() - 3 * DAY


def record(name: str, created_at: float, owner: str | None = None) -> ClusterRecord:
    return ClusterRecord(owner=owner,
        name=name, provider="ssh", cloud_name=f"{name}-1", status=ClusterStatus.UP,
        num_nodes=1, requested_resources=ResourceRequest(Resources(Infra("ssh"))),
        config_hash="x", created_at=created_at, status_updated_at=created_at,
        launched_resources=Placement("ssh", "rack", None, None, 2, 8))


class Bed:
    def __init__(self, db: Database, tmp_path: Path) -> None:
        self.db = db
        self.kept = KeptLogStore(tmp_path / "kept", Caps(1000, 10_000, 100))
        # $1 per host-hour.
        self.ledger = Ledger(db, Prices(lambda: UserConfig(tmp_path / "config.yaml"),
                                        lambda: {"rack": Pool("rack", (), price_per_hour=1.0)}))
        self.cost = CostService(self.ledger, db, self.kept, ManagedJobStore(db))

    async def life(self, name: str, start: float, end: float, closed_out: bool = True,
                   owner: str | None = None) -> None:
        """Running from `start` to `end`, UP half an hour in, one job for the next hour."""
        await self.ledger.running(record(name, start, owner), at=start)
        await self.ledger.ended(name, at=end)
        await self.db.write([(
            "INSERT INTO cluster_events (ts, cluster, kind, from_status, to_status, reason)"
            " VALUES (?, ?, 'status', 'INIT', 'UP', 'test')", [start + H / 2, name])])
        directory = self.kept.remember(KeptCluster(name, "ssh", "ssh/rack", start))
        self.kept.note_job(directory, KeptJob(1, status="SUCCEEDED", started_at=start + H / 2,
                                              ended_at=start + 1.5 * H, complete=True))
        if closed_out:
            self.kept.close_out(directory, "TERMINATED", "down", end)

    async def settled(self) -> list[str]:
        rows = await self.db.fetchall("SELECT cluster FROM cost_settled ORDER BY cluster")
        return [row["cluster"] for row in rows]

    async def splits(self, days: float) -> dict[str, dict[str, object]]:
        report = await self.cost.report(days)
        return {c["name"]: c["split"] for c in report["clusters"]}


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Bed:
    made = Bed(db, tmp_path)
    await made.ledger.load()
    return made


WHOLE = {"provisioning": pytest.approx(0.5), "idle": pytest.approx(0.5), "stopped": 0.0,
         "jobs": [{"job_id": 1, "cost": pytest.approx(1.0)}]}


async def test_settled_once_then_read_past_its_sources(bed: Bed, tmp_path: Path) -> None:
    await bed.life("a", T0, T0 + 2 * H)
    await bed.life("late", time.time() - 2 * H, time.time() - 60)  # ended a minute ago
    await bed.life("open", T0, T0 + 2 * H, closed_out=False)  # its last copy is not done
    splits = await bed.splits(30)
    assert await bed.settled() == ["a"]
    assert splits["a"] == splits["open"] == WHOLE
    assert await bed.cost.settle() == 0  # nothing new: written once
    # The events and the kept copy go (their own bounds): the settled split stays whole,
    # where a split made anew would call the whole hour setup and the job's hour idle.
    await bed.db.write([("DELETE FROM cluster_events", [])])
    shutil.rmtree(tmp_path / "kept")
    splits = await bed.splits(30)
    assert splits["a"] == WHOLE
    assert splits["open"]["provisioning"] == pytest.approx(2.0)  # "open" settles now ...
    assert await bed.settled() == ["a", "open"]  # ... with what is left of its sources


async def test_a_window_from_mid_life_splits_anew(bed: Bed) -> None:
    await bed.life("a", T0, T0 + 2 * H)
    await bed.cost.settle()
    # From an hour in: the job's last half hour and the idle half hour after it.
    splits = await bed.splits((time.time() - (T0 + H)) / DAY)
    assert splits["a"] == {"provisioning": 0.0, "idle": pytest.approx(0.5, rel=1e-3),
                           "stopped": 0.0, "jobs": [{"job_id": 1,
                                                     "cost": pytest.approx(0.5, rel=1e-3)}]}


async def test_retention_forgets_the_settled_split_with_its_intervals(bed: Bed) -> None:
    await bed.life("a", T0, T0 + 2 * H)
    await bed.cost.settle()
    assert await bed.ledger.prune(time.time()) == 1
    assert await bed.settled() == []
    assert (await bed.cost.report(30))["clusters"] == []


async def test_a_settled_report_is_the_report_split_anew(bed: Bed) -> None:
    for n in range(4):  # n + 2 hours each; two are a managed job's attempts
        await bed.life(f"c{n}", T0 + n * DAY / 8, T0 + n * DAY / 8 + (n + 2) * H,
                       owner="managed-job:7" if n % 2 else None)
    await bed.life("older", T0 - 40 * DAY, T0 - 40 * DAY + 2 * H)  # before the window
    since = time.time() - 30 * DAY
    intervals = await bed.ledger.intervals(since)
    up = {r["cluster"]: [r["ts"]] for r in await bed.db.fetchall(
        "SELECT cluster, ts FROM cluster_events")}
    jobs = bed.cost._jobs({(i.cluster, i.incarnation) for i in intervals})
    anew = build(Window(since, time.time()), intervals, up,
                 lambda name, inc: jobs.get((name, inc), []), {}, limit=2)
    settled = await bed.cost.report(30, limit=2)
    assert await bed.settled() == ["c0", "c1", "c2", "c3", "older"]
    assert [c["name"] for c in settled["clusters"]] == ["c3", "c2"]
    for key in ("clusters", "others", "total", "split", "providers", "managed_jobs",
                "burn_rate"):
        assert settled[key] == anew[key], key
    # Days summed in SQL, in another order: equal to the last bits of a float.
    assert settled["days"] == [{"day": d["day"], "cost": pytest.approx(d["cost"])}
                               for d in anew["days"]]
    assert settled["managed_jobs"] == [{"job_id": 7, "name": "", "cost": pytest.approx(8.0),
                                        "recoveries": pytest.approx(3.0), "attempts": 2}]
    # One cluster asked for: listed from its settled row, the same as split anew.
    alone = await bed.cost.report(30, limit=2, only="c0")
    assert [c["name"] for c in alone["clusters"]] == ["c0"]
    assert alone["clusters"] == build(
        Window(since, time.time()), intervals, up, lambda name, inc: jobs.get((name, inc), []),
        {}, only="c0")["clusters"]
    assert alone["total"] == settled["total"]


async def test_a_managed_jobs_cluster_is_split_by_its_runs(db: Database, tmp_path: Path) -> None:
    """Such a cluster has no kept copy (the controller keeps its job's log): its job is the
    managed job's stretch RUNNING, from the job's events, in the fresh split and the
    settled one alike; before that, all of it was called idle."""
    from clusterd.managed.store import OWNER_PREFIX, SubmittedTask

    bed = Bed(db, tmp_path)
    managed = ManagedJobStore(db)
    await managed.load()
    bed.cost = CostService(bed.ledger, db, bed.kept, managed)
    await bed.ledger.load()
    job = await managed.insert("train", SubmittedTask(command="python train.py"), "sky")
    await bed.ledger.running(record(job.cluster, T0, f"{OWNER_PREFIX}{job.id}"), at=T0)
    await bed.ledger.ended(job.cluster, at=T0 + 2 * H)
    await db.write([
        ("INSERT INTO cluster_events (ts, cluster, kind, from_status, to_status, reason)"
         " VALUES (?, ?, 'status', 'INIT', 'UP', 'test')", [T0 + H / 2, job.cluster]),
        *[("INSERT INTO managed_job_events (ts, job_id, from_status, to_status, reason)"
           " VALUES (?, ?, ?, ?, 'test')", [ts, job.id, before, after])
          for ts, before, after in [(T0, "PENDING", "STARTING"),
                                    (T0 + H / 2, "STARTING", "RUNNING"),
                                    (T0 + 1.5 * H, "RUNNING", "RECOVERING")]]])
    fresh = await bed.splits(30)  # settles it (ended days ago) and reads it back
    assert await bed.settled() == [job.cluster]
    assert fresh[job.cluster] == WHOLE
    report = await bed.cost.report(30)
    (listed,) = report["managed_jobs"]
    assert (listed["job_id"], listed["cost"]) == (job.id, pytest.approx(2.0))
