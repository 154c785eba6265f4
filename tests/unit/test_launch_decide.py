"""decide(): every step a launch (or `start`) can take with the cluster it names, from the
record and what was observed, with no I/O."""

from __future__ import annotations

import dataclasses
import time

import pytest

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.providers.base import Placement
from clusterd.provision.plan import FINAL, LaunchRequest, Observed, Step, autostop_for, decide
from clusterd.state.clusters import ClusterRecord
from clusterd.state.handles import ClusterHandle
from clusterd.tasks.spec import Autostop, ResourceRequest, Resources, TaskSpec
from tests.scripted_provider import ScriptedHandle

PLACE = Placement("scripted", "r1", "r1-a", "s.node", 4, 16)
NODES = ClusterHandle(intent=PLACE, provider=ScriptedHandle("r1-a"))
REQUEST = LaunchRequest("c", TaskSpec())


def cluster(status: ClusterStatus = ClusterStatus.UP, handle: ClusterHandle = NODES,
            ever_up: bool = True, owner: str | None = None) -> ClusterRecord:
    now = time.time()
    return ClusterRecord("c", "scripted", "c-000000", status, 2, ResourceRequest(), "h", now, now,
                         handle=handle, ever_up=ever_up, owner=owner)


def test_no_record_is_a_new_cluster() -> None:
    assert decide(REQUEST, None, Observed()) == Step.NEW


def test_a_stopped_cluster_is_started_before_anything_is_looked_at() -> None:
    assert decide(REQUEST, cluster(ClusterStatus.STOPPED), Observed()) == Step.START
    assert decide(None, cluster(ClusterStatus.STOPPED), Observed()) == Step.START


def test_a_launch_that_died_before_its_create_answered_is_resumed() -> None:
    record = cluster(ClusterStatus.INIT, ClusterHandle(intent=PLACE, create_token="t"),
                     ever_up=False)
    assert decide(REQUEST, record, Observed()) == Step.RESUME


def test_a_cluster_that_was_up_is_checked_for_lost_nodes_then_recreated_in_place() -> None:
    assert decide(REQUEST, cluster(), Observed()) == Step.CHECK_NODES
    assert decide(REQUEST, cluster(), Observed(lost_nodes=True)) == Step.RECREATE
    assert decide(REQUEST, cluster(), Observed(lost_nodes=False)) == Step.CHECK_RUNTIME


def test_a_launch_that_died_after_its_create_waits_for_the_nodes_first() -> None:
    record = cluster(ClusterStatus.INIT, ever_up=False)
    assert decide(REQUEST, record, Observed()) == Step.WAIT
    # Never UP: no nodes to lose, so no query before the runtime is looked at.
    assert decide(REQUEST, record, Observed(waited=True)) == Step.CHECK_RUNTIME


@pytest.mark.parametrize(("status", "health", "step"), [
    (ClusterStatus.UP, "healthy", Step.REUSE),
    (ClusterStatus.UP, "unhealthy", Step.REPAIR),
    (ClusterStatus.UP, "other version", Step.UPGRADE),
    # INIT (a worker lost, say): a healthy agent is not enough, the runtime starts again.
    (ClusterStatus.INIT, "healthy", Step.REPAIR),
])
def test_the_runtime_decides_between_reuse_repair_and_upgrade(
        status: ClusterStatus, health: str, step: Step) -> None:
    observed = Observed(lost_nodes=False, runtime=health)  # type: ignore[arg-type]
    assert decide(REQUEST, cluster(status), observed) == step


def test_only_the_owner_may_use_a_cluster_and_start_checks_no_owner() -> None:
    mine = LaunchRequest("c", TaskSpec(), owner="managed-job-1")
    decide(mine, cluster(owner="managed-job-1"), Observed())
    with pytest.raises(ProtocolError) as caught:
        decide(REQUEST, cluster(owner="managed-job-1"), Observed())
    assert caught.value.code == ErrorCode.MANAGED_CLUSTER
    with pytest.raises(ProtocolError):
        decide(mine, cluster(), Observed())
    assert decide(None, cluster(owner="managed-job-1"), Observed()) == Step.CHECK_NODES


def test_every_path_ends_in_a_final_step() -> None:
    """Executing what decide asks and observing reaches a final step in a few rounds."""
    for record in (cluster(), cluster(ClusterStatus.INIT, ever_up=False)):
        observed, steps = Observed(), []
        while (step := decide(REQUEST, record, observed)) not in FINAL:
            steps.append(step)
            observed = dataclasses.replace(
                observed, lost_nodes=False if step == Step.CHECK_NODES else observed.lost_nodes,
                waited=observed.waited or step == Step.WAIT,
                runtime="healthy" if step == Step.CHECK_RUNTIME else observed.runtime)
            assert len(steps) <= 2


def test_the_autostop_a_launch_sets_is_its_flags_over_the_tasks_own() -> None:
    task = TaskSpec(resources=Resources(autostop=Autostop(10)))
    assert autostop_for(None, False, TaskSpec()) is None
    assert autostop_for(5, False, task) == Autostop(5)
    # A managed job's launch (no flags) keeps the task's, as a user's does.
    assert autostop_for(None, False, task) == Autostop(10)
    assert autostop_for(None, True, task) == Autostop(10, down=True)
    assert autostop_for(None, True, TaskSpec()) == Autostop(0, down=True)
