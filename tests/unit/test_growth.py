"""What the daemon and the agent keep stays bounded: finished requests, agent job records and
their logs; and concurrent forced refreshes share one cycle."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent.jobs_db import JobStore
from clusterd.agent.logs import LogHub
from clusterd.services.refresh import RefreshService
from clusterd.state.db import Database
from clusterd.state.requests import RequestState, RequestStore

pytestmark = pytest.mark.anyio


@pytest.fixture
async def requests(tmp_path: Path) -> AsyncIterator[RequestStore]:
    db = Database(tmp_path / "state.db")
    await db.open()
    try:
        yield RequestStore(db)
    finally:
        await db.close()


async def test_finished_requests_beyond_the_retention_go(requests: RequestStore) -> None:
    running = await requests.create("launch", "old", {})  # still running: never pruned
    for _ in range(30):
        record = await requests.create("exec", "dev", {})
        await requests.finish(record.id, RequestState.SUCCEEDED)
    removed = await requests.prune(keep=10)
    assert removed == 20
    kept = await requests.recent(limit=100)
    assert len(kept) == 11 and running.id in {r.id for r in kept}
    assert await requests.prune(keep=10) == 0


async def test_the_agent_forgets_old_finished_jobs_and_their_logs(tmp_path: Path) -> None:
    store = JobStore(tmp_path / "jobs.db")
    await store.open()
    hub = LogHub(tmp_path / "jobs")
    try:
        jobs = []
        for index in range(12):
            job = await store.add(name=f"j{index}", user="u", spec={}, has_secrets=False,
                                  resources_display="", num_nodes=1)
            log = hub.open(job.job_id)
            log.write(b"output\n")
            hub.close(job.job_id)
            status = JobStatus.RUNNING if index == 0 else JobStatus.SUCCEEDED
            await store.update(job, status=status)
            jobs.append(job)
        removed = await store.prune(keep=5)
        for job_id in removed:
            hub.remove(job_id)
        # The 7 oldest finished go; the running one stays, whatever its age.
        assert removed == [j.job_id for j in jobs[1:8]]
        assert [j.job_id for j in store.all()] == [jobs[0].job_id] + [j.job_id for j in
                                                                       jobs[8:]]
        # The unfinished ones are known without a scan of the finished (the scheduler asks
        # on every turn): the running one, and a job just added (INIT).
        fresh = await store.add(name="new", user="u", spec={}, has_secrets=False,
                                resources_display="", num_nodes=1)
        assert [j.job_id for j in store.active()] == [jobs[0].job_id, fresh.job_id]
        await store.update(fresh, status=JobStatus.CANCELLED)
        assert [j.job_id for j in store.active()] == [jobs[0].job_id]
        assert not hub.log_dir(jobs[1].job_id).exists()
        assert hub.log_dir(jobs[0].job_id).exists() and hub.log_dir(jobs[-1].job_id).exists()
    finally:
        await store.close()
    again = JobStore(tmp_path / "jobs.db")  # and on disk
    await again.open()
    try:
        assert len(again.all()) == 6
        assert [j.job_id for j in again.active()] == [jobs[0].job_id]
    finally:
        await again.close()


def _refresh_counting(delay: float) -> tuple[RefreshService, list[list[str] | None]]:
    service = RefreshService(*([None] * 7), interval_s=30.0)  # type: ignore[arg-type]
    cycles: list[list[str] | None] = []

    async def cycle(names: list[str] | None = None, *, force: bool = False) -> None:
        assert force
        cycles.append(names)
        await anyio.sleep(delay)

    service.cycle = cycle  # type: ignore[method-assign]
    return service, cycles


async def test_concurrent_forced_refreshes_share_a_cycle() -> None:
    service, cycles = _refresh_counting(0.2)
    async with anyio.create_task_group() as group:
        group.start_soon(service.refresh_now, ["a"])
        await anyio.sleep(0.05)  # the first cycle is running: these all wait for the next
        for name in ("b", "c", "d"):
            group.start_soon(service.refresh_now, [name])
        group.start_soon(service.refresh_now, ["b"])
    assert cycles == [["a"], ["b", "c", "d"]]


async def test_a_cancelled_forced_refresh_leaves_the_next_caller_its_own() -> None:
    service, cycles = _refresh_counting(0.2)
    done: list[Any] = []

    async def second() -> None:
        await anyio.sleep(0.05)
        await service.refresh_now(None)
        done.append(True)

    async with anyio.create_task_group() as group:
        group.start_soon(second)
        with anyio.move_on_after(0.1):
            await service.refresh_now(["x"])  # its client goes away mid-cycle
    assert done == [True] and cycles == [["x"], None]


async def test_callers_served_by_an_abandoned_cycle_are_served_again() -> None:
    service, cycles = _refresh_counting(0.2)

    async def later(name: str, delay: float) -> None:
        await anyio.sleep(delay)
        await service.refresh_now([name])

    async with anyio.create_task_group() as group:
        group.start_soon(service.refresh_now, ["a"])
        group.start_soon(later, "c", 0.08)  # waits behind "b" for the cycle after "a"
        await anyio.sleep(0.05)
        with anyio.move_on_after(0.3):  # "b" joins the cycle after "a", then leaves mid-way
            await service.refresh_now(["b"])
    assert cycles == [["a"], ["b", "c"], ["b", "c"]]
