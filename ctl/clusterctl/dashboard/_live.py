"""Live updates: one server-sent-events stream per open page.

Every message is a named event with a JSON object; the page's script knows a handful:
`replace` and `prepend` (`{id, html}`: server-rendered fragments), `log` (`{html}`: job
output, its SSE id the byte offset reached, so a reconnecting browser resumes where it left
off), `notice` (`{level, message, hint}`), `health` (`{ok, message}`: whether clusterd
answers), `gone` (`{message}`: the cluster or job is no more) and `done` (stop listening).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Coroutine
from typing import Any

from aiohttp import web
from markupsafe import Markup

from clusterctl import protocol
from clusterctl.client import ClusterdError
from clusterctl.protocol import ErrorCode, JobStatus

from . import _costdata, _timeline
from ._ansi import AnsiToHtml
from ._board import Dashboard, cluster_name
from ._charts import node_charts
from ._views import digest

KEEPALIVE_S = 15.0
CLUSTER_POLL_S = 2.0
NODES_POLL_S = 10.0
JOB_POLL_S = 2.0
LOG_TAIL_LINES = 1000
# Log output gathered into one message while more is already waiting (fewer, larger writes
# keep a fast job's page up to date).
LOG_BATCH_BYTES = 256 * 1024


class Live:
    """One page's event stream."""

    def __init__(self, response: web.StreamResponse) -> None:
        self._response = response
        self._lock = asyncio.Lock()
        self.sent: dict[str, str] = {}  # fragment id -> the html last sent

    async def send(self, event: str, data: dict[str, Any], event_id: int | None = None
                   ) -> None:
        lines = [f"event: {event}"]
        if event_id is not None:
            lines.append(f"id: {event_id}")
        lines.append("data: " + json.dumps(data, separators=(",", ":")))
        payload = ("\n".join(lines) + "\n\n").encode()
        async with self._lock:
            await self._response.write(payload)

    async def replace(self, fragment: str, html: str) -> None:
        """Send a fragment unless the page already shows exactly that (the page compares
        digests with what it was drawn with)."""
        if self.sent.get(fragment) != html:
            self.sent[fragment] = html
            await self.send("replace", {"id": fragment, "html": html, "hash": digest(html)})

    async def keepalive(self) -> None:
        while True:
            await asyncio.sleep(KEEPALIVE_S)
            async with self._lock:
                await self._response.write(b": keepalive\n\n")


Producer = Callable[[Dashboard, Live], Coroutine[Any, Any, None]]


async def serve(request: web.Request, *producers: Producer) -> web.StreamResponse:
    board: Dashboard = request.app["board"]
    response = web.StreamResponse(headers={"Content-Type": "text/event-stream",
                                           "X-Accel-Buffering": "no"})
    await response.prepare(request)
    live = Live(response)
    task = asyncio.current_task()
    assert task is not None
    board.live_tasks.add(task)
    try:
        async with asyncio.TaskGroup() as group:
            for producer in (_health, _notices, _banner, *producers):
                group.create_task(producer(board, live))
            group.create_task(live.keepalive())
            group.create_task(_gone(request))
    except* (ConnectionError, Finished):
        pass  # the page went away, or there is nothing more to show
    except* asyncio.CancelledError:
        pass  # the dashboard is stopping
    finally:
        board.live_tasks.discard(task)
    return response


class Finished(Exception):
    """A page's stream has nothing more to say (its job ended, its cluster is gone)."""


async def _health(board: Dashboard, live: Live) -> None:
    seen = -1
    while True:
        if board.link.health.version != seen:
            seen = board.link.health.version
            ok, why = board.link.health.value
            await live.send("health", {"ok": ok, "message": why})
        await board.link.health.next(seen)


async def _notices(board: Dashboard, live: Live) -> None:
    shown = seen = board.notices.latest.version  # only what happens while the page is open
    while True:
        seen = await board.notices.latest.next(seen)
        for notice in board.notices.after(shown):
            shown = notice["id"]
            await live.send("notice", notice)


async def _banner(board: Dashboard, live: Live) -> None:
    """The budget banner, redrawn as the daemon's notices change."""
    seen = -1
    while True:
        if board.banner.lines.version != seen:
            seen = board.banner.lines.version
            await live.replace("banner", board.render("_banner.html",
                                                      lines=board.banner.lines.value))
        await board.banner.lines.next(seen)


async def _gone(request: web.Request) -> None:
    """End the stream soon after the browser goes (a quiet page writes nothing for a while)."""
    # aiohttp offers no event for a client gone while its handler is quiet: look every second.
    while request.transport is not None and not request.transport.is_closing():  # noqa: ASYNC110
        await asyncio.sleep(1.0)
    raise ConnectionResetError("the page went away")


# -- the clusters page ------------------------------------------------------------------------


async def clusters(request: web.Request) -> web.StreamResponse:
    return await serve(request, _overview)


async def _overview(board: Dashboard, live: Live) -> None:
    with board.overview.watching():
        seen = 0
        while True:
            seen = await board.overview.snapshot.next(seen)
            overview = board.overview.snapshot.value
            if overview is None:
                continue
            await live.replace("clusters", board.render("_clusters.html", overview=overview))
            await live.replace("requests", board.render("_requests.html", overview=overview))


# -- the events page --------------------------------------------------------------------------


async def events(request: web.Request) -> web.StreamResponse:
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        after = 0
    return await serve(request, _event_rows(after, None))


def _event_rows(after: int, cluster: str | None) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        shown = after
        seen = 0
        while True:
            new = board.events.after(shown, cluster)
            if new:
                shown = new[-1]["id"]
                html = board.render("_events.html", events=list(reversed(new)))
                await live.send("prepend", {"id": "events", "html": html})
            seen = await board.events.latest.next(seen)
    return produce


# -- a cluster --------------------------------------------------------------------------------


async def cluster(request: web.Request) -> web.StreamResponse:
    name = cluster_name(request)
    try:
        after = int(request.query.get("after", "0"))
    except ValueError:
        after = 0
    return await serve(request, _cluster_parts(name), _event_rows(after, name))


def _cluster_parts(name: str) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        nodes_at = -NODES_POLL_S
        version, newest = board.events.latest.version, board.events.latest.value
        loop = asyncio.get_running_loop()
        while True:
            try:
                status = await board.link.call(protocol.StatusArgs(clusters=[name],
                                                                   verbose=True))
            except ClusterdError as exc:
                if exc.code == ErrorCode.CLUSTER_NOT_FOUND:
                    await live.send("gone", {"message": f"Cluster {name} is gone (torn "
                                                        "down)."})
                    raise Finished from None
                await asyncio.sleep(CLUSTER_POLL_S)
                continue
            view = status["clusters"][0]
            await live.replace("summary", board.render("_cluster.html", cluster=view))
            jobs = await jobs_of(board, view)
            await live.replace("jobs", board.render("_jobs.html", cluster=view, **jobs))
            if loop.time() - nodes_at >= NODES_POLL_S:
                # The slower parts: the provider's word on the nodes, their use, and the
                # timeline (its right edge is now: redrawn as often, not every poll).
                nodes_at = loop.time()
                await live.replace("nodes", board.render("_nodes.html",
                                                         **await nodes_of(board, name)))
                await live.replace("usage", board.render("_usage.html",
                                                         **await usage_of(board, view)))
                await live.replace("timeline", str(await timeline_of(board, name,
                                                                     jobs["jobs"])))
                cost = await _costdata.cluster_cost(board.costs, name, view.get("launched_at"))
                await live.replace("cluster-cost", board.render("_cluster_cost.html",
                                                                cluster=name, **cost))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(CLUSTER_POLL_S):
                    while True:  # until an event of this cluster (or the timeout)
                        version = await board.events.latest.next(version)
                        mine = board.events.after(newest, name)
                        newest = board.events.latest.value
                        if mine:
                            nodes_at = -NODES_POLL_S  # a change of status: look at them now
                            break
    return produce


async def jobs_of(board: Dashboard, view: dict[str, Any]) -> dict[str, Any]:
    if view["status"] != "UP":
        return {"jobs": None, "error": f"the cluster is {view['status']}: no job queue"}
    try:
        queue = await board.link.call(protocol.QueueArgs(cluster=view["name"]))
    except ClusterdError as exc:
        return {"jobs": None, "error": f"{exc.message} [{exc.code}]"}
    # Newest first, as `clusterctl queue` lists them.
    jobs = sorted(queue.get("jobs", []), key=lambda j: int(j["job_id"]), reverse=True)
    return {"jobs": jobs, "error": ""}


async def usage_of(board: Dashboard, view: dict[str, Any]) -> dict[str, Any]:
    """What the usage fragment draws: each node's charts over the last hour (UP clusters)."""
    if view["status"] != "UP":
        return {"nodes": None, "error": f"the cluster is {view['status']}: nothing sampled"}
    try:
        result = await board.link.call(protocol.NodeUsageArgs(cluster=view["name"]))
    except ClusterdError as exc:
        return {"nodes": None, "error": f"{exc.message} [{exc.code}]"}
    now = time.time()
    return {"error": "", "nodes": [
        {"ip": n.get("ip") or n.get("node_id"), "head": n.get("head"),
         "samples": len(n.get("ts") or []), "charts": node_charts(n, now)}
        for n in result.get("nodes", [])]}


async def timeline_of(board: Dashboard, name: str, jobs: list[dict[str, Any]] | None
                      ) -> Markup:
    try:
        events = await board.link.call(protocol.EventsArgs(cluster=name,
                                                           limit=_timeline.EVENTS_DRAWN))
    except ClusterdError as exc:
        return Markup('<p class="muted">{} [{}]</p>').format(exc.message, exc.code)
    return await _timeline.draw(board.link, board.steps, events.get("events", []), jobs or [])


async def nodes_of(board: Dashboard, name: str) -> dict[str, Any]:
    try:
        result = await board.link.call(protocol.NodesArgs(cluster=name))
    except ClusterdError as exc:
        return {"nodes": None, "error": f"{exc.message} [{exc.code}]"}
    return {"nodes": result.get("nodes", []), "error": ""}


# -- a job ------------------------------------------------------------------------------------


async def job(request: web.Request) -> web.StreamResponse:
    name = cluster_name(request)
    job_id = int(request.match_info["job_id"])
    resume = request.headers.get("Last-Event-ID", "")
    offset = int(resume) if resume.isdigit() else None
    return await serve(request, _log(name, job_id, offset), _job_status(name, job_id))


def _log(name: str, job_id: int, offset: int | None) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        args = protocol.LogsArgs(cluster=name, job_id=job_id, follow=True,
                                 tail=0 if offset is not None else LOG_TAIL_LINES,
                                 offset=offset)

        async def first(data: dict[str, Any]) -> None:
            if offset is None and data["offset"] > len(data["data"]):
                await live.send("replace", {"id": "log-note", "html": (
                    f"Showing the last {LOG_TAIL_LINES} lines; "
                    f'<a href="/clusters/{name}/jobs/{job_id}/log.txt">the whole '
                    "log</a>.")})

        result = await relay_log(board, live, args, first=first)
        await _send_status(board, live, name, job_id)
        await live.send("done", {"status": result.get("status")})
        raise Finished
    return produce


async def relay_log(board: Dashboard, live: Live, args: protocol.OpArgs, skip_to: int = 0,
                    first: Callable[[dict[str, Any]], Awaitable[None]] | None = None
                    ) -> dict[str, Any]:
    """Send a log stream (`log` events `{data, offset}`) to the page as HTML, in batches,
    each with the byte offset it reaches as its SSE id; leave out the bytes before `skip_to`
    (what a reconnecting page showed already). `first` sees the first event's data. Returns
    the stream's result; an error ends the page's stream with a notice."""
    converter = AnsiToHtml()
    try:
        async with board.link.stream(args) as stream:
            batch: list[str] = []
            size = reached = 0
            async for event, data in stream:
                if event != "log":
                    continue
                if first is not None:
                    await first(data)
                    first = None
                chunk: bytes = data["data"]
                reached = int(data["offset"])
                if reached <= skip_to:
                    continue
                chunk = chunk[max(0, len(chunk) - (reached - skip_to)):]
                batch.append(converter.feed(chunk))
                size += len(chunk)
                if stream.pending_frames == 0 or size >= LOG_BATCH_BYTES:
                    await live.send("log", {"html": "".join(batch)}, reached)
                    batch, size = [], 0
            if batch:
                await live.send("log", {"html": "".join(batch)}, reached)
        result = stream.result or {}
    except ClusterdError as exc:
        await live.send("notice", {"level": "error", "message": f"{exc.message} "
                                   f"[{exc.code}]", "hint": exc.hint})
        raise Finished from None
    await live.send("log", {"html": converter.feed(b"", final=True)})
    return result


async def _send_status(board: Dashboard, live: Live, name: str, job_id: int) -> str | None:
    try:
        queue = await board.link.call(protocol.QueueArgs(cluster=name))
    except ClusterdError:
        return None
    job = next((j for j in queue.get("jobs", []) if j["job_id"] == job_id), None)
    if job is None:
        return None
    await live.replace("job-status", board.render("_job.html", cluster=name, job=job))
    await live.replace("job-cost", board.render(
        "_job_cost.html", **await _costdata.job_cost(board.costs, name, job)))
    return str(job["status"])


def _job_status(name: str, job_id: int) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        while True:
            status = await _send_status(board, live, name, job_id)
            if status is not None and JobStatus(status).is_terminal:
                return
            await asyncio.sleep(JOB_POLL_S)
    return produce


# -- a request --------------------------------------------------------------------------------


async def request(request: web.Request) -> web.StreamResponse:
    request_id = int(request.match_info["request_id"])
    return await serve(request, _request_progress(request_id))


def _request_progress(request_id: int) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        outcome: dict[str, Any]
        try:
            async with board.link.stream(protocol.FollowRequestArgs(request_id=request_id)
                                         ) as stream:
                async for event, data in stream:
                    html = board.render("_progress.html", event=event, data=data).strip()
                    if html:
                        await live.send("append", {"id": "progress", "html": html})
            outcome = {"result": stream.result or {}, "error": None}
        except ClusterdError as exc:
            outcome = {"result": None, "error": exc}
        await live.replace("outcome", board.render("_outcome.html", **outcome))
        await live.send("done", {})
        raise Finished
    return produce
