"""The ledger dates changes by the provider's own clock (NodeInfo.launched_at / stopped_at):
a launch from when the nodes were started, a stop or a loss found after a gap (a daemon that
was down) from when it happened, clamped so that no second is lost or counted twice; and
where the providers read those times (EC2's LaunchTime and StateTransitionReason, a pod's
startTime and its containers' finishedAt)."""

from __future__ import annotations

import datetime
import itertools
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from clusterd.cost.ledger import RUNNING, STOPPED, Ledger, changed_at, node_times
from clusterd.nodes import NodeInfo, NodeStatus
from clusterd.providers.aws import lifetimes
from clusterd.providers.kubernetes import pods
from clusterd.provision.plan import LaunchRequest
from clusterd.state.db import Database
from clusterd.tasks.spec import TaskSpec
from tests.scripted_provider import Services, build_services
from tests.unit.test_cost_ledger import prices, record

pytestmark = pytest.mark.anyio


def node(status: NodeStatus, launched: float | None = None,
         stopped: float | None = None) -> NodeInfo:
    return NodeInfo("n", "10.0.0.1", status, launched_at=launched, stopped_at=stopped)


async def intervals(db: Database) -> list[tuple[str, int, float, float | None]]:
    rows = await db.fetchall("SELECT kind, nodes, started_at, ended_at FROM cost_intervals"
                             " ORDER BY id")
    return [(r["kind"], r["nodes"], r["started_at"], r["ended_at"]) for r in rows]


def assert_no_overlap(found: list[tuple[str, int, float, float | None]]) -> None:
    for (_, _, _, end), (_, _, start, _) in itertools.pairwise(found):
        assert end is not None and start >= end, found


@pytest.fixture
async def ledger(db: Database) -> Ledger:
    book = Ledger(db, prices())
    await book.load()
    return book


# -- the ledger's hook after a gap ---------------------------------------------------------


async def test_nodes_found_gone_close_at_the_providers_time(ledger: Ledger,
                                                            db: Database) -> None:
    start = time.time() - 600
    dev = record()
    await ledger.running(dev, at=start)
    gone = start + 100  # while the daemon was down; it comes back minutes later
    await ledger.observed(dev, [node(NodeStatus.TERMINATED, start, gone),
                                node(NodeStatus.TERMINATED, start, gone - 5)])
    assert await intervals(db) == [(RUNNING, 2, start, gone)]


async def test_a_stop_found_after_a_gap_turns_running_into_stopped_then(
        ledger: Ledger, db: Database) -> None:
    start = time.time() - 600
    dev = record()
    await ledger.running(dev, at=start)
    stop = start + 300
    await ledger.observed(dev, [node(NodeStatus.STOPPED, start, stop)] * 2)
    assert await intervals(db) == [(RUNNING, 2, start, stop), (STOPPED, 2, stop, None)]


async def test_a_preempted_node_splits_the_interval_at_its_termination(
        ledger: Ledger, db: Database) -> None:
    start = time.time() - 600
    dev = record()
    await ledger.running(dev, at=start)
    lost = start + 200
    await ledger.observed(dev, [node(NodeStatus.RUNNING, start),
                                node(NodeStatus.TERMINATED, start, lost)])
    assert await intervals(db) == [(RUNNING, 2, start, lost), (RUNNING, 1, lost, None)]


async def test_a_start_found_after_a_gap_opens_at_its_launch_time(
        ledger: Ledger, db: Database) -> None:
    stop = time.time() - 600
    dev = record()
    await ledger.running(dev, at=stop - 60)
    await ledger.stopped(dev, at=stop)
    started = stop + 120
    await ledger.observed(dev, [node(NodeStatus.RUNNING, started)] * 2)
    assert await intervals(db) == [(RUNNING, 2, stop - 60, stop), (STOPPED, 2, stop, started),
                                   (RUNNING, 2, started, None)]


async def test_a_launch_time_from_before_the_stop_is_not_believed(ledger: Ledger,
                                                                  db: Database) -> None:
    """A provider that keeps the first launch's time across a stop and a start: the start
    is dated when seen, so the stopped stretch is not counted as running."""
    first = time.time() - 600
    dev = record()
    await ledger.running(dev, at=first)
    await ledger.stopped(dev, at=first + 60)
    before = time.time()
    await ledger.observed(dev, [node(NodeStatus.RUNNING, first)] * 2)
    found = await intervals(db)
    assert found[0] == (RUNNING, 2, first, first + 60)
    assert found[1][:3] == (STOPPED, 2, first + 60)
    assert found[2][:2] == (RUNNING, 2) and found[2][2] >= before
    assert_no_overlap(found)


async def test_a_stop_time_before_the_interval_began_is_clamped_to_it(
        ledger: Ledger, db: Database) -> None:
    start = time.time() - 600
    dev = record()
    await ledger.running(dev, at=start)
    await ledger.observed(dev, [node(NodeStatus.STOPPED, start - 50, start - 10)] * 2)
    assert await intervals(db) == [(RUNNING, 2, start, start), (STOPPED, 2, start, None)]


async def test_a_time_in_the_future_is_now(ledger: Ledger, db: Database) -> None:
    dev = record()
    await ledger.running(dev, at=time.time() - 600)
    await ledger.observed(dev, [node(NodeStatus.TERMINATED, None, time.time() + 3600)])
    [(_, _, _, end)] = await intervals(db)
    assert end is not None and end <= time.time()


async def test_a_node_whose_time_is_unknown_dates_the_change_when_seen(
        ledger: Ledger, db: Database) -> None:
    start = time.time() - 600
    dev = record()
    await ledger.running(dev, at=start)
    before = time.time()
    await ledger.observed(dev, [node(NodeStatus.TERMINATED, start, start + 10),
                                node(NodeStatus.TERMINATED, start, None)])
    [(_, _, _, end)] = await intervals(db)
    assert end is not None and end >= before


async def test_no_interval_opens_before_the_clusters_last_one_ended_even_after_a_restart(
        db: Database, ledger: Ledger) -> None:
    now = time.time()
    first = record(created_at=now - 900)
    await ledger.running(first, at=now - 900)
    await ledger.ended("dev", at=now - 300)
    revived = Ledger(db, prices())
    await revived.load()
    # A stopped stretch dated before the last end (a provider's stale stop time) starts
    # where the last one ended, not before it.
    again = record(created_at=now - 200)
    await revived.stopped(again, at=now - 400)
    found = await intervals(db)
    assert found[-1][0] == STOPPED and found[-1][2] == now - 300
    assert_no_overlap(found)


async def test_nodes_started_and_stopped_moments_apart_count_their_own_seconds(
        ledger: Ledger, db: Database) -> None:
    """A launch's head and workers are made by separate calls: one interval for all of
    them, from the mean of their starts to the mean of their stops, counts each node's own
    seconds."""
    t = time.time() - 600
    dev = record()
    await ledger.running(dev, at=(t, t + 1))
    await ledger.stopped(dev, at=(t + 100, t + 102))
    found = await intervals(db)
    assert found == [(RUNNING, 2, t + 0.5, t + 101), (STOPPED, 2, t + 101, None)]
    start, end = found[0][2], found[0][3]
    assert end is not None and 2 * (end - start) == pytest.approx(100 + 101)  # each's own


async def one_of_two_preempted(ledger: Ledger) -> float:
    """A 2-node cluster launched at t, one node preempted at t + 100 (found by refresh): t."""
    t = time.time() - 600
    dev = record()
    await ledger.running(dev, at=(t, t))
    await ledger.observed(dev, [node(NodeStatus.RUNNING, t),
                                node(NodeStatus.TERMINATED, t, t + 100)])
    return t


async def test_a_down_after_a_preemption_ends_at_the_last_nodes_termination(
        ledger: Ledger, db: Database) -> None:
    t = await one_of_two_preempted(ledger)
    # The down finds both gone: the one preempted before the stretch began is not this
    # change's (else the mean would end the survivor's stretch too early).
    await ledger.ended("dev", at=(t + 100, t + 300))
    assert await intervals(db) == [(RUNNING, 2, t, t + 100), (RUNNING, 1, t + 100, t + 300)]


async def test_a_repaired_node_starts_the_interval_at_its_own_launch(
        ledger: Ledger, db: Database) -> None:
    t = await one_of_two_preempted(ledger)
    await ledger.running(record(), at=(t, t + 200))  # the survivor, and the node made again
    assert (await intervals(db))[-1] == (RUNNING, 2, t + 200, None)


def test_changed_at_is_the_last_nodes_change_or_unknown() -> None:
    assert changed_at([node(NodeStatus.RUNNING, 10.0), node(NodeStatus.RUNNING, 12.0)]) == 12.0
    # A running node counts from its start, a gone one from its end: the latest is the change.
    assert changed_at([node(NodeStatus.RUNNING, 10.0, 99.0),
                       node(NodeStatus.TERMINATED, 5.0, 30.0)]) == 30.0
    assert changed_at([node(NodeStatus.STOPPED, 10.0, None)]) is None
    assert changed_at([]) is None
    assert node_times([node(NodeStatus.RUNNING, 10.0), node(NodeStatus.STOPPED, 1.0, 12.0)]
                      ) == (10.0, 12.0)
    assert node_times([node(NodeStatus.RUNNING, None)]) is None and node_times([]) is None


# -- the services date their changes by the provider --------------------------------------


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Services:
    return await build_services(db, tmp_path)


async def test_launch_stop_and_start_are_dated_by_the_providers_clock(
        bed: Services, db: Database) -> None:
    t = time.time()
    bed.provider.clock = t - 300  # the nodes were created then (booting takes a while)
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec(num_nodes=2)))
    bed.provider.clock = t - 200
    await bed.clusters.stop(bed.request("stop"), "c")
    bed.provider.clock = t - 100
    await bed.clusters.start(bed.request("start"), "c")
    bed.provider.clock = None  # a down whose provider keeps no time: when it is done
    before = time.time()
    await bed.clusters.down(bed.request("down"), "c", purge=False)
    found = await intervals(db)
    assert found[:2] == [(RUNNING, 2, t - 300, t - 200), (STOPPED, 2, t - 200, t - 100)]
    assert found[2][:3] == (RUNNING, 2, t - 100)
    assert found[2][3] is not None and found[2][3] >= before


async def test_a_start_whose_provider_keeps_the_first_launch_time_is_dated_when_done(
        bed: Services, db: Database) -> None:
    t = time.time()
    bed.provider.clock = t - 300
    bed.provider.start_keeps_launch_time = True
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    bed.provider.clock = t - 200
    await bed.clusters.stop(bed.request("stop"), "c")
    before = time.time()
    await bed.clusters.start(bed.request("start"), "c")
    found = await intervals(db)
    assert found[1][:3] == (STOPPED, 1, t - 200) and found[2][2] >= before
    assert_no_overlap(found)


async def test_a_provider_that_keeps_no_times_is_not_asked_on_stop_or_down(
        bed: Services, db: Database, monkeypatch: pytest.MonkeyPatch) -> None:
    """local and ssh date nothing: stop and down do not ask them for their nodes again."""
    monkeypatch.setattr(type(bed.provider), "keeps_node_times", False)
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    asked = len(bed.provider.calls)
    before = time.time()
    await bed.clusters.stop(bed.request("stop"), "c")
    await bed.clusters.down(bed.request("down"), "c", purge=False)
    # The one query is the teardown's own (which nodes to reach before terminating).
    assert [call for call, *_ in bed.provider.calls[asked:]] == ["stop", "query", "terminate"]
    found = await intervals(db)
    assert found[0][3] is not None and found[0][3] >= before  # dated when done


# -- where the providers read their times --------------------------------------------------


def epoch(text: str) -> float:
    return datetime.datetime.fromisoformat(text).replace(tzinfo=datetime.UTC).timestamp()


@pytest.mark.parametrize(("reason", "wanted"), [
    ("User initiated (2026-12-06 17:20:01 GMT)", epoch("2026-12-06 17:20:01")),  # EC2
    ("User initiated (2026-12-06 17:20:01 UTC)", epoch("2026-12-06 17:20:01")),  # moto
    ("Service initiated (2026-12-06 17:21:02 GMT)", epoch("2026-12-06 17:21:02")),  # spot
    ("User initiated shutdown", None),  # from inside the instance: no time given
    ("", None),
])
def test_ec2_stop_time_from_the_state_transition_reason(reason: str,
                                                        wanted: float | None) -> None:
    instance = {"State": {"Name": "stopped"}, "StateTransitionReason": reason}
    assert lifetimes.stopped_at(instance) == wanted


def test_a_running_instance_has_no_stop_time() -> None:
    # EC2 clears the reason on a start; an old one left over would say the last stop.
    assert lifetimes.stopped_at({"State": {"Name": "running"}, "StateTransitionReason":
                                 "User initiated (2026-12-06 17:20:01 GMT)"}) is None


def test_ec2_launch_time_as_the_api_gives_it_and_as_a_handle_records_it() -> None:
    when = datetime.datetime(2026, 12, 6, 17, 20, 1, 250000, tzinfo=datetime.UTC)
    assert lifetimes.launched_at(when) == when.timestamp()
    assert lifetimes.launched_at(str(when)) == when.timestamp()  # AWSNode.launched
    assert lifetimes.launched_at(when.replace(tzinfo=None)) == when.timestamp()
    assert lifetimes.launched_at("") is None and lifetimes.launched_at("garbage") is None


def pod(start: object, finished: list[object | None]) -> SimpleNamespace:
    states = [SimpleNamespace(terminated=None if f is None else SimpleNamespace(finished_at=f))
              for f in finished]
    return SimpleNamespace(status=SimpleNamespace(
        start_time=start, container_statuses=[SimpleNamespace(state=s) for s in states]))


def test_a_pods_start_and_the_end_of_its_last_container() -> None:
    start = datetime.datetime(2026, 12, 6, 17, 0, tzinfo=datetime.UTC)
    end = datetime.datetime(2026, 12, 6, 18, 0, tzinfo=datetime.UTC)
    assert pods.lifetime(pod(start, [None])) == (start.timestamp(), None)
    assert pods.lifetime(pod(start, [start, end])) == (start.timestamp(), end.timestamp())
    assert pods.lifetime(pod(start, [end, None])) == (start.timestamp(), None)  # one runs
    assert pods.lifetime(pod("2026-12-06T17:00:00Z", [])) == (start.timestamp(), None)
    assert pods.lifetime(None) == (None, None)

