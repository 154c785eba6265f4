"""What every request handler shares, pages (`_app.py`, `_managed.py`) and live streams
(`_live.py`) alike: the `Dashboard` (daemon link, feeds, templates, assets), the checked
cluster name of a request's path, JSON bodies and errors of actions, and logs as plain text.
A module of its own so that none of those imports another back."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import re
from collections.abc import AsyncIterator, Coroutine
from importlib import resources as package_files
from typing import Any

from aiohttp import web

from clusterctl import protocol
from clusterctl.client import ClusterdError
from clusterctl.protocol import ErrorCode

from . import _ansi
from ._banner import BudgetBanner
from ._costdata import ReportCache
from ._daemon import DaemonLink, EventsFeed, Notices, OverviewFeed
from ._security import Guard
from ._timeline import StepCache
from ._views import environment

LOG = logging.getLogger("clusterctl.dashboard")
NAME = re.compile(r"^[a-zA-Z]([-_.a-zA-Z0-9]*[a-zA-Z0-9])?$")


class Dashboard:
    """Everything a request handler needs: the daemon link, the feeds, the templates."""

    def __init__(self, link: DaemonLink, guard: Guard) -> None:
        self.link = link
        self.guard = guard
        self.overview = OverviewFeed(link)
        self.events = EventsFeed(link, self.overview)
        self.notices = Notices()
        self.banner = BudgetBanner(link)  # the daemon's budget notices, on every page
        self.costs = ReportCache(link)
        self.templates = environment()
        self.steps = StepCache()  # finished requests' steps, for timelines
        # The handlers of open live streams: aiohttp's tasks, not ours; cancelled at shutdown
        # so that the server does not wait out its shutdown timeout on them.
        self.live_tasks: set[asyncio.Task[Any]] = set()
        self._group: asyncio.TaskGroup | None = None
        self._assets: dict[str, bytes] = {}

    @contextlib.asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The dashboard's background work (its feeds, the actions it follows) as tasks of
        one group: leaving this block cancels them all and waits for them to end."""
        try:
            async with asyncio.TaskGroup() as group:
                self._group = group
                group.create_task(self.overview.run())
                group.create_task(self.events.run())
                group.create_task(self.banner.run())
                try:
                    yield
                finally:
                    self._group = None
                raise _Stopping  # the feeds never end on their own: this stops them
        except* _Stopping:
            pass

    def spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run `work` in the dashboard's task group (see `running`). A failure of `work` is
        logged, not raised: one action gone wrong must not stop the dashboard."""
        if self._group is None:
            work.close()
            raise RuntimeError("the dashboard is not running")
        self._group.create_task(_logged(work))

    def render(self, name: str, **values: Any) -> str:
        return self.templates.get_template(name).render(**values)

    def page(self, name: str, live: str, status: int = 200, **values: Any) -> web.Response:
        text = self.render(name, live=live, banner=self.banner.lines.value, **values)
        return web.Response(text=text, status=status, content_type="text/html")

    def error_page(self, error: ClusterdError, status: int = 502) -> web.Response:
        if error.code in (ErrorCode.CLUSTER_NOT_FOUND, ErrorCode.JOB_NOT_FOUND,
                          ErrorCode.REQUEST_NOT_FOUND, ErrorCode.MANAGED_JOB_NOT_FOUND):
            status = 404
        return self.page("error.html", "", status=status, error=error)

    def asset(self, name: str) -> bytes:
        if name not in self._assets:
            if name == "ansi.css":
                self._assets[name] = _ansi.stylesheet().encode()
            else:
                files = package_files.files("clusterctl.dashboard") / "static" / name
                self._assets[name] = files.read_bytes()
        return self._assets[name]


async def _logged(work: Coroutine[Any, Any, None]) -> None:
    try:
        await work
    except Exception:
        LOG.exception("a background task of the dashboard failed")


class _Stopping(Exception):
    """Raised in the dashboard's task group to cancel what it still runs (feeds, actions)."""


def cluster_name(request: web.Request) -> str:
    """The cluster named in the request's path; 404 unless it is a valid cluster name."""
    name = request.match_info["name"]
    if not NAME.match(name) or len(name) > 63:
        raise web.HTTPNotFound(text="no such cluster name")
    return name


def json_error(error: ClusterdError, status: int = 400) -> web.Response:
    """An action's failure, as the page's script shows it: the daemon's code, message, hint."""
    if error.code == "DAEMON_UNAVAILABLE":
        status = 502
    return web.json_response({"ok": False, "error": {"code": error.code, "message":
                                                     error.message, "hint": error.hint}},
                             status=status)


async def json_body(request: web.Request) -> dict[str, Any]:
    """An action's body: a JSON object, or the request is refused."""
    if request.content_type != "application/json":
        raise web.HTTPUnsupportedMediaType(text="send JSON")
    try:
        body = await request.json()
    except ValueError:
        raise web.HTTPBadRequest(text="the body is not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    return body


async def log_text(request: web.Request, args: protocol.OpArgs,
                   saved_as: str | None = None) -> web.StreamResponse:
    """A whole log (the `log` events of `args`' stream) as plain text, escape sequences
    removed, streamed as it comes; with `saved_as`, as a file of that name to save (the
    name is made of a checked cluster name and numbers: nothing to quote)."""
    board: Dashboard = request.app["board"]
    headers = {"Content-Type": "text/plain; charset=utf-8"}
    if saved_as is not None:
        headers["Content-Disposition"] = f'attachment; filename="{saved_as}"'
    response = web.StreamResponse(headers=headers)
    try:
        async with board.link.stream(args) as stream:
            async for event, data in stream:
                if event == "log":
                    if not response.prepared:
                        await response.prepare(request)
                    await response.write(_ansi.strip(data["data"]).encode())
    except ClusterdError as exc:
        if response.prepared:
            await response.write(f"\n[{exc.code}] {exc.message}\n".encode())
        else:
            return board.error_page(exc)
    if not response.prepared:
        await response.prepare(request)
    await response.write_eof()
    return response
