"""Torn-down clusters (the daemon's `history` op): a page of them all, and the page a link to
a gone cluster lands on instead of an error, with its jobs and links to their kept logs
(`log.txt`, which the daemon serves from its kept copy once the cluster is gone)."""

from __future__ import annotations

from aiohttp import web

from clusterctl import protocol
from clusterctl.client import ClusterdError

from ._board import Dashboard, cluster_name

SHOWN = 200


async def history_page(request: web.Request) -> web.Response:
    board: Dashboard = request.app["board"]
    try:
        result = await board.link.call(protocol.HistoryArgs(limit=SHOWN))
    except ClusterdError as exc:
        return board.error_page(exc)
    return board.page("history.html", "", clusters=result.get("clusters", []), cluster_name="",
                      nav="history")


async def cluster_history_page(request: web.Request) -> web.Response:
    return await gone_cluster_page(request, cluster_name(request), None)


async def gone_cluster_page(request: web.Request, name: str,
                            error: ClusterdError | None) -> web.Response:
    """The cluster's history (its incarnations newest first); `error` (else not found) if
    there is none."""
    board: Dashboard = request.app["board"]
    try:
        result = await board.link.call(protocol.HistoryArgs(cluster=name, limit=20))
    except ClusterdError as exc:
        return board.error_page(exc)
    clusters = result.get("clusters", [])
    if not clusters:
        return board.error_page(error or ClusterdError(
            protocol.ErrorCode.CLUSTER_NOT_FOUND, f"no cluster {name} was torn down",
            "see the history"))
    return board.page("history.html", "", clusters=clusters, cluster_name=name,
                      nav="history")
