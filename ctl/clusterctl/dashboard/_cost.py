"""The cost page (`/cost?days=N`): spend per day by provider and by cluster, the biggest
spenders with their split, idle's share, the burn rate and the budgets; kept current over
its live stream. One `cost_report` call per look (`_costdata.ReportCache`)."""

from __future__ import annotations

import asyncio

from aiohttp import web

from clusterctl.client import ClusterdError

from ._board import Dashboard
from ._costdata import days_asked, page_view
from ._live import Live, Producer, serve

COST_POLL_S = 15.0
DAY_CHOICES = (1, 7, 30, 90, 365)


async def cost_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    days = days_asked(request.query.get("days"))
    try:
        report = await board.costs.get(days)
    except ClusterdError as exc:
        return board.error_page(exc)
    return board.page("cost.html", f"/live/cost?days={days}", nav="cost", days=days,
                      choices=DAY_CHOICES, view=page_view(report))


async def live_cost(request: web.Request) -> web.StreamResponse:
    return await serve(request, _redraw(days_asked(request.query.get("days"))))


def _redraw(days: int) -> Producer:
    async def produce(board: Dashboard, live: Live) -> None:
        while True:
            await asyncio.sleep(COST_POLL_S)
            try:
                report = await board.costs.get(days)
            except ClusterdError:
                continue  # the health line says that clusterd does not answer
            await live.replace("cost", board.render("_cost.html", days=days,
                                                    view=page_view(report)))
    return produce
