"""The dashboard's web application: pages (server-rendered), assets, actions, and the server's
life (bind 127.0.0.1, print the URL, serve until Ctrl-C or SIGTERM).

Pages draw what the daemon says now; `_live.py` keeps them current over server-sent events.
Actions are JSON POSTs that make one daemon call each; errors come back with the daemon's
code, message and hint.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Awaitable, Callable

from aiohttp import web
from aiohttp.http_exceptions import BadHttpMessage

from clusterctl import protocol
from clusterctl.client import ClusterdError
from clusterctl.protocol import ErrorCode

from . import _cost, _costdata, _history, _live, _managed, _timeline
from ._board import Dashboard, cluster_name, json_body, json_error, log_text
from ._daemon import DaemonLink
from ._security import Guard

ASSETS = {"dashboard.js": "application/javascript", "dashboard.css": "text/css"}
DONE_WORDS = {"stop": "stopped", "start": "started", "down": "torn down"}
DOING_WORDS = {"stop": "Stopping", "start": "Starting", "down": "Tearing down"}
ACTION_START_TIMEOUT_S = 30.0
EVENTS_SHOWN = 200
EVENTS_SHOWN_OF_CLUSTER = 50


# -- pages ------------------------------------------------------------------------------------


async def clusters_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    try:
        overview = await board.overview.fresh()
    except ClusterdError as exc:
        return board.error_page(exc)
    return board.page("clusters.html", "/live/clusters", overview=overview, nav="clusters")


async def cluster_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    name = cluster_name(request)
    try:
        status, events = await asyncio.gather(
            board.link.call(protocol.StatusArgs(clusters=[name], verbose=True)),
            board.link.call(protocol.EventsArgs(cluster=name, limit=_timeline.EVENTS_DRAWN)))
    except ClusterdError as exc:
        if exc.code == ErrorCode.CLUSTER_NOT_FOUND:  # gone: its history, if it has one
            return await _history.gone_cluster_page(request, name, exc)
        return board.error_page(exc)
    cluster = status["clusters"][0]
    jobs, nodes, usage, cost = await asyncio.gather(
        _live.jobs_of(board, cluster), _live.nodes_of(board, name),
        _live.usage_of(board, cluster),
        _costdata.cluster_cost(board.costs, name, cluster.get("launched_at")))
    history = events.get("events", [])
    drawn = await _timeline.draw(board.link, board.steps, history, jobs["jobs"] or [])
    shown = list(reversed(history[-EVENTS_SHOWN_OF_CLUSTER:]))
    after = shown[0]["id"] if shown else 0
    return board.page("cluster.html", f"/live/clusters/{name}?after={after}", cluster=cluster,
                      events=shown, nav="clusters", jobs_part=jobs, nodes_part=nodes,
                      usage_part=usage, cost_part=cost, timeline=drawn)


async def job_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    name = cluster_name(request)
    job_id = int(request.match_info["job_id"])
    try:
        queue = await board.link.call(protocol.QueueArgs(cluster=name))
    except ClusterdError as exc:
        if exc.code == ErrorCode.CLUSTER_NOT_FOUND:
            return await _history.gone_cluster_page(request, name, exc)
        return board.error_page(exc)
    job = next((j for j in queue.get("jobs", []) if j["job_id"] == job_id), None)
    if job is None:
        return board.error_page(ClusterdError(ErrorCode.JOB_NOT_FOUND,
                                              f"cluster {name} has no job {job_id}",
                                              f"see the jobs of {name}"))
    cost = await _costdata.job_cost(board.costs, name, job)
    return board.page("job.html", f"/live/clusters/{name}/jobs/{job_id}", cluster=name,
                      job=job, nav="clusters", tail=_live.LOG_TAIL_LINES, cost_part=cost)


async def job_log_text(request: web.Request) -> web.StreamResponse:
    """The whole log as plain text (escape sequences removed), streamed; with `?download`,
    as a file to save (`CLUSTER-job-ID.log`)."""
    name = cluster_name(request)
    job_id = int(request.match_info["job_id"])
    saved_as = f"{name}-job-{job_id}.log" if "download" in request.query else None
    return await log_text(request, protocol.LogsArgs(cluster=name, job_id=job_id,
                                                     follow=False), saved_as)


async def events_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    try:
        result = await board.link.call(protocol.EventsArgs(limit=EVENTS_SHOWN))
    except ClusterdError as exc:
        return board.error_page(exc)
    events = list(reversed(result.get("events", [])))
    after = events[0]["id"] if events else 0
    return board.page("events.html", f"/live/events?after={after}", events=events,
                      nav="events")


async def request_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    request_id = int(request.match_info["request_id"])
    try:
        result = await board.link.call(protocol.RequestsArgs(active_only=False))
    except ClusterdError as exc:
        return board.error_page(exc)
    running = next((r for r in result.get("running", []) if r["id"] == request_id), None)
    record = next((r for r in result.get("recent", []) if r["id"] == request_id), None)
    return board.page("request.html", f"/live/requests/{request_id}", request_id=request_id,
                      running=running, record=record, nav="clusters")


async def asset(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    name = request.match_info["file"]
    kind = ASSETS.get(name) or ("text/css" if name == "ansi.css" else None)
    if kind is None:
        raise web.HTTPNotFound()
    return web.Response(body=board.asset(name), content_type=kind)


# -- actions ----------------------------------------------------------------------------------


async def lifecycle_action(request: web.Request) -> web.Response:
    """stop, start or down: started here, followed in the background; how it ended becomes a
    notice on every open page. Answers once the daemon has taken the request."""
    board: Dashboard = request.app["board"]
    name = cluster_name(request)
    verb = request.match_info["verb"]
    await json_body(request)
    args: protocol.OpArgs = {"stop": protocol.StopArgs, "start": protocol.StartArgs,
                             "down": protocol.DownArgs}[verb](cluster=name)
    taken: asyncio.Future[int | None] = asyncio.get_running_loop().create_future()
    board.spawn(_follow_action(board, args, verb, name, taken))
    try:
        async with asyncio.timeout(ACTION_START_TIMEOUT_S):
            request_id = await asyncio.shield(taken)
    except ClusterdError as exc:
        return json_error(exc)
    except TimeoutError:
        return json_error(ClusterdError(ErrorCode.INTERNAL, "clusterd did not take the "
                                        "request in time", "see `clusterctl requests`"), 504)
    return web.json_response({"ok": True, "request_id": request_id,
                              "message": f"{DOING_WORDS[verb]} {name} (request {request_id})."})


async def _follow_action(board: Dashboard, args: protocol.OpArgs, verb: str, name: str,
                         taken: asyncio.Future[int | None]) -> None:
    try:
        async with board.link.stream(args) as stream:
            async for event, data in stream:
                if event == "request" and not taken.done():
                    taken.set_result(int(data["request_id"]))
        if not taken.done():
            taken.set_result(None)
        result = stream.result or {}
        done = DONE_WORDS[verb]
        if verb == "stop" and result.get("changed") is False:
            done = "already stopped"
        board.notices.add("ok", f"Cluster {name} {done}.")
    except ClusterdError as exc:
        if not taken.done():
            taken.set_exception(exc)
        else:
            board.notices.add("error", f"{verb} {name}: {exc.message} [{exc.code}]", exc.hint)
    board.overview.poke()


async def autostop_action(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    name = cluster_name(request)
    body = await json_body(request)
    cancel = bool(body.get("cancel"))
    minutes = body.get("idle_minutes")
    if not cancel:
        try:
            minutes = float(minutes)  # type: ignore[arg-type]
        except (TypeError, ValueError):
            return json_error(ClusterdError(ErrorCode.INVALID_ARGUMENT,
                                            "idle minutes must be a number", "e.g. 30"))
    try:
        result = await board.link.call(protocol.AutostopArgs(
            cluster=name, idle_minutes=None if cancel else minutes,
            down=bool(body.get("down")), cancel=cancel))
    except ClusterdError as exc:
        return json_error(exc)
    board.overview.poke()
    setting = result.get("autostop")
    message = (f"Autostop of {name} cancelled." if setting is None else
               f"{name}: {'tear down' if setting['down'] else 'stop'} after "
               f"{setting['idle_minutes']:g} idle minutes.")
    return web.json_response({"ok": True, "message": message})


async def cancel_action(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    name = cluster_name(request)
    job_id = int(request.match_info["job_id"])
    await json_body(request)
    try:
        result = await board.link.call(protocol.CancelArgs(cluster=name, job_ids=[job_id]))
    except ClusterdError as exc:
        return json_error(exc)
    message = (f"Job {job_id} on {name} cancelled." if job_id in result.get("cancelled", [])
               else f"Job {job_id} on {name} had already finished.")
    return web.json_response({"ok": True, "message": message})


# -- the server -------------------------------------------------------------------------------


def build_app(board: Dashboard) -> web.Application:
    app = web.Application(middlewares=[board.guard.middleware], client_max_size=64 * 1024)
    app["board"] = board
    job = r"/clusters/{name}/jobs/{job_id:\d{1,18}}"
    get: list[tuple[str, Callable[[web.Request], Awaitable[web.StreamResponse]]]] = [
        ("/", clusters_page),
        ("/clusters/{name}", cluster_page),
        (job, job_page),
        (job + "/log.txt", job_log_text),
        ("/events", events_page),
        (r"/requests/{request_id:\d{1,18}}", request_page),
        ("/static/{file}", asset),
        ("/live/clusters", _live.clusters),
        ("/live/clusters/{name}", _live.cluster),
        ("/live" + job, _live.job),
        ("/live/events", _live.events),
        (r"/live/requests/{request_id:\d{1,18}}", _live.request),
        ("/history", _history.history_page),
        ("/history/{name}", _history.cluster_history_page),
        ("/managed-jobs", _managed.list_page),
        (_managed.PATH, _managed.job_page),
        (_managed.PATH + "/log.txt", _managed.log_txt),
        ("/live/managed-jobs", _managed.live_list),
        ("/live" + _managed.PATH, _managed.live_job),
        ("/cost", _cost.cost_page),
        ("/live/cost", _cost.live_cost),
    ]
    for path, handler in get:
        app.router.add_get(path, handler, allow_head=False)
    app.router.add_post("/api/clusters/{name}/{verb:stop|start|down}", lifecycle_action)
    app.router.add_post("/api/clusters/{name}/autostop", autostop_action)
    app.router.add_post("/api" + job + "/cancel", cancel_action)
    app.router.add_post("/api" + _managed.PATH + "/cancel", _managed.cancel_action)
    app.router.add_post("/api/login-code", board.guard.new_code_handler)
    app.on_response_prepare.append(board.guard.headers)
    app.on_shutdown.append(_stop_live)
    return app


class _NoMalformedRequests(logging.Filter):
    """aiohttp answers a request its parser refuses (raw control or non-ASCII bytes, say) with
    400, and logs its parse error's traceback: noise that any local process could print in
    the dashboard's terminal. The 400 says it all."""

    def filter(self, record: logging.LogRecord) -> bool:
        error = record.exc_info[1] if record.exc_info else None
        return not isinstance(error, BadHttpMessage)


SERVER_LOG = logging.getLogger("clusterctl.dashboard.server")
SERVER_LOG.addFilter(_NoMalformedRequests())


def make_runner(board: Dashboard) -> web.AppRunner:
    """The server of `board`'s application, as `serve` runs it (and the tests, on their own
    sockets)."""
    return web.AppRunner(build_app(board), access_log=None, shutdown_timeout=2.0,
                         logger=SERVER_LOG)


async def _stop_live(app: web.Application) -> None:
    board: Dashboard = app["board"]
    for task in board.live_tasks:
        task.cancel()


def bind(port: int) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind(("127.0.0.1", port))
    except OSError:
        sock.close()
        raise
    sock.listen(128)
    sock.setblocking(False)
    return sock


async def serve(socket_path: str, sock: socket.socket, started: Callable[[Guard], None],
                autostart: bool | None = None) -> None:
    """Serve on `sock` until SIGINT or SIGTERM; `started(guard)` once it accepts (its port,
    its token, login URLs). `autostart` as for clusterctl (None: unless
    CLUSTERD_NO_AUTOSTART is set)."""
    port = int(sock.getsockname()[1])
    guard = Guard(port)
    link = DaemonLink(socket_path, autostart)
    board = Dashboard(link, guard)
    runner = make_runner(board)
    await runner.setup()
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    try:
        async with board.running():
            await web.SockSite(runner, sock).start()
            started(guard)
            await stop.wait()
    finally:
        with contextlib.suppress(Exception):
            await runner.cleanup()
        await link.close()
        for signum in (signal.SIGINT, signal.SIGTERM):
            loop.remove_signal_handler(signum)
