"""A cluster's timeline, gathered: its events, its jobs, and the steps of the requests its
events name (launch phases, stops, starts), drawn by `_charts.timeline`.

A finished request's steps never change: they are fetched once (`follow_request` replays
what the daemon kept) and remembered, a bounded number of them.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from typing import Any

from markupsafe import Markup

from clusterctl import protocol
from clusterctl.client import ClusterdError

from ._charts import phases_of, timeline

REQUESTS_DRAWN = 6
STEPS_REMEMBERED = 200
EVENTS_DRAWN = 200


class StepCache:
    """The steps of finished requests, by id; the oldest remembered forgotten first."""

    def __init__(self, size: int = STEPS_REMEMBERED) -> None:
        self._size = size
        self._steps: OrderedDict[int, list[dict[str, Any]]] = OrderedDict()

    def get(self, request_id: int) -> list[dict[str, Any]] | None:
        return self._steps.get(request_id)

    def put(self, request_id: int, steps: list[dict[str, Any]]) -> None:
        self._steps[request_id] = steps
        while len(self._steps) > self._size:
            self._steps.popitem(last=False)


async def request_steps(link: Any, cache: StepCache, request: dict[str, Any]
                        ) -> list[dict[str, Any]]:
    """A request's `progress` steps (cached once it has finished); none if clusterd says
    nothing of it."""
    request_id = int(request["id"])
    cached = cache.get(request_id)
    if cached is not None:
        return cached
    steps: list[dict[str, Any]] = []
    try:
        async with link.stream(protocol.FollowRequestArgs(request_id=request_id)) as stream:
            async for event, data in stream:
                if event == "progress":
                    steps.append(data)
    except ClusterdError:
        pass  # a failed request's stream ends with its error: its steps came before
    if request.get("finished_at"):
        cache.put(request_id, steps)
    return steps


async def draw(link: Any, cache: StepCache, events: list[dict[str, Any]],
               jobs: list[dict[str, Any]]) -> Markup:
    """The timeline of a cluster whose events (oldest first) and jobs are given."""
    try:
        listed = await link.call(protocol.RequestsArgs(active_only=False))
    except ClusterdError:
        listed = {}
    known = {int(r["id"]): {**r, "started_at": r.get("created_at")}
             for r in listed.get("recent", [])}
    known.update({int(r["id"]): r for r in listed.get("running", [])})
    named = list(dict.fromkeys(int(e["request_id"]) for e in reversed(events)
                               if e.get("request_id")))
    requests = [known[i] for i in named if i in known][:REQUESTS_DRAWN]
    found = await asyncio.gather(*(request_steps(link, cache, r) for r in requests))
    phases = [span for request, steps in zip(requests, found, strict=True)
              for span in phases_of(request, steps)]
    return timeline(events, jobs, phases)
