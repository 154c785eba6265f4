"""The scheduler's feasibility check asks Ray for the nodes only when a recent view cannot
say yes: a burst of submissions costs one GCS round trip, and a refusal is always fresh."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd.agent import scheduler as scheduler_module
from clusterd.agent.jobs_db import JobStore
from clusterd.agent.logs import LogHub
from clusterd.agent.scheduler import Infeasible, NodeView, Scheduler

pytestmark = pytest.mark.anyio


def node(name: str, cpus: float) -> NodeView:
    return NodeView(name, "127.0.0.1", {"CPU": cpus})


async def test_a_recent_yes_is_reused_and_a_no_is_asked_afresh(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    scheduler = Scheduler(JobStore(tmp_path / "jobs.db"), LogHub(tmp_path / "jobs"), "c")
    views = [[node("a", 2)], [node("a", 2), node("b", 4)], [node("a", 2)]]
    asked: list[int] = []

    async def nodes() -> list[NodeView]:
        asked.append(1)
        return views[len(asked) - 1]

    clock = [100.0]
    monkeypatch.setattr(scheduler, "nodes", nodes)
    monkeypatch.setattr(scheduler_module.time, "monotonic", lambda: clock[0])

    await scheduler.check_feasible(1, {"cpus": 1})
    await scheduler.check_feasible(1, {"cpus": 2})  # the view of a moment ago says yes
    assert len(asked) == 1
    await scheduler.check_feasible(2, {"cpus": 1})  # it says no: asked again, and yes now
    assert len(asked) == 2
    clock[0] += scheduler_module.NODE_VIEW_S  # too old to say yes: asked, and b is gone
    with pytest.raises(Infeasible, match="this cluster has 1"):
        await scheduler.check_feasible(2, {"cpus": 1})
    assert len(asked) == 3
