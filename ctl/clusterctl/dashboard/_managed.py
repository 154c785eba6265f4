"""The managed-jobs pages: the list, a job (its record, attempts, events and live log), its
log as text, and cancel. Each is one or two daemon calls (`jobs_queue`, `jobs_events`,
`jobs_logs`, `jobs_cancel`), drawn by the server, kept current by `_live.serve`.

A managed job's record outlives its cluster, so these pages never go "gone": they follow the
job to its final status and stop there.
"""

from __future__ import annotations

import asyncio
from typing import Any

from aiohttp import web

from clusterctl import protocol
from clusterctl.client import ClusterdError
from clusterctl.protocol import ErrorCode, ManagedJobStatus

from ._board import Dashboard, json_body, json_error, log_text
from ._costdata import managed_cost
from ._live import Finished, Live, Producer, relay_log, serve

LIST_POLL_S = 1.0
JOB_POLL_S = 1.0
# The newest events a job page draws at first (a job that waited days for capacity has an
# event per round); newer ones are added live.
EVENTS_SHOWN = 500
PATH = r"/managed-jobs/{job_id:\d{1,18}}"


def _job_id(request: web.Request) -> int:
    return int(request.match_info["job_id"])


async def _queue(board: Dashboard) -> list[dict[str, Any]]:
    result = await board.link.call(protocol.JobsQueueArgs(all=True))
    return list(result.get("jobs", []))


async def _find(board: Dashboard, job_id: int) -> dict[str, Any]:
    job = next((j for j in await _queue(board) if j["job_id"] == job_id), None)
    if job is None:
        raise ClusterdError(ErrorCode.MANAGED_JOB_NOT_FOUND,
                            f"there is no managed job {job_id}", "see the managed jobs")
    return job


async def _events(board: Dashboard, job_id: int, after: int = 0
                  ) -> tuple[list[dict[str, Any]], str]:
    """The job's events newer than `after` (oldest first), or why there are none to show."""
    try:
        result = await board.link.call(protocol.JobsEventsArgs(job_id=job_id, after=after))
    except ClusterdError as exc:
        if exc.code == ErrorCode.UNKNOWN_OP:
            return [], "this clusterd does not list a managed job's events (upgrade it)"
        return [], f"{exc.message} [{exc.code}]"
    return list(result.get("events", [])), ""


# -- pages ------------------------------------------------------------------------------------


async def list_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    try:
        jobs = await _queue(board)
    except ClusterdError as exc:
        return board.error_page(exc)
    return board.page("managed_jobs.html", "/live/managed-jobs", jobs=jobs, nav="managed")


async def job_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    job_id = _job_id(request)
    try:
        job = await _find(board, job_id)
    except ClusterdError as exc:
        return board.error_page(exc)
    (events, note), cost = await asyncio.gather(_events(board, job_id),
                                                managed_cost(board.costs, job))
    after = events[-1]["id"] if events else 0
    return board.page("managed_job.html", f"/live/managed-jobs/{job_id}?after={after}",
                      job=job, events=list(reversed(events[-EVENTS_SHOWN:])),
                      all_events=events, events_note=note, cost_part=cost, nav="managed")


async def log_txt(request: web.Request) -> web.StreamResponse:
    """The job's whole log, across its attempts, as plain text."""
    job_id = _job_id(request)
    saved_as = f"managed-job-{job_id}.log" if "download" in request.query else None
    return await log_text(request, protocol.JobsLogsArgs(job_id=job_id, follow=False),
                          saved_as)


async def cancel_action(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    job_id = _job_id(request)
    await json_body(request)
    try:
        result = await board.link.call(protocol.JobsCancelArgs(job_ids=[job_id]))
    except ClusterdError as exc:
        return json_error(exc)
    message = (f"Managed job {job_id}: cancelling (its cluster is torn down)."
               if job_id in result.get("cancelled", [])
               else f"Managed job {job_id} has already ended.")
    return web.json_response({"ok": True, "message": message})


# -- live -------------------------------------------------------------------------------------


async def live_list(request: web.Request) -> web.StreamResponse:
    return await serve(request, _list_rows)


async def _list_rows(board: Dashboard, live: Live) -> None:
    while True:
        try:
            jobs = await _queue(board)
        except ClusterdError:
            pass  # the health line says that clusterd does not answer
        else:
            await live.replace("managed-jobs", board.render("_managed_jobs.html", jobs=jobs))
        await asyncio.sleep(LIST_POLL_S)


async def live_job(request: web.Request) -> web.StreamResponse:
    job_id = _job_id(request)
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        after = 0
    resume = request.headers.get("Last-Event-ID", "")
    # The events already drawn (up to `after`) are fetched again once: the attempts table
    # is drawn from all of them.
    parts = _JobParts(job_id, after)
    return await serve(request, parts.produce,
                       _log(job_id, int(resume) if resume.isdigit() else 0, parts))


class _JobParts:
    """A job page's record, attempts and events, kept current until the job ends."""

    def __init__(self, job_id: int, drawn: int) -> None:
        self.job_id = job_id
        self.drawn = drawn  # the newest event id the page shows
        self.events: list[dict[str, Any]] = []
        # The poll and the log's end both send: one at a time, or events come twice.
        self._sending = asyncio.Lock()

    async def send(self, board: Dashboard, live: Live) -> str | None:
        """Send what changed; the job's status (None if clusterd did not say)."""
        async with self._sending:
            try:
                job = await _find(board, self.job_id)
            except ClusterdError:
                return None
            newest = self.events[-1]["id"] if self.events else 0
            new, _ = await _events(board, self.job_id, after=newest)
            self.events.extend(new)
            await self._draw(board, live, job)
            return str(job["status"])

    async def _draw(self, board: Dashboard, live: Live, job: dict[str, Any]) -> None:
        await live.replace("managed-job", board.render("_managed_job.html", job=job))
        await live.replace("managed-cost", board.render(
            "_managed_cost.html", **await managed_cost(board.costs, job)))
        await live.replace("attempts", board.render("_managed_attempts.html",
                                                    events=self.events))
        unseen = [e for e in self.events if e["id"] > self.drawn]
        if unseen:
            self.drawn = unseen[-1]["id"]
            await live.send("prepend", {"id": "events", "html": board.render(
                "_managed_events.html", events=list(reversed(unseen)))})

    async def produce(self, board: Dashboard, live: Live) -> None:
        while True:
            status = await self.send(board, live)
            if status is not None and ManagedJobStatus(status).is_final:
                return
            await asyncio.sleep(JOB_POLL_S)


def _log(job_id: int, skip_to: int, parts: _JobParts) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        args = protocol.JobsLogsArgs(job_id=job_id, follow=True)
        result = await relay_log(board, live, args, skip_to=skip_to)
        await parts.send(board, live)  # the final status, before the page stops listening
        await live.send("done", {"status": result.get("status")})
        raise Finished
    return produce
