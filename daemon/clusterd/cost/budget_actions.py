"""The budget controller's actions in the daemon: each a daemon-owned request (so
`clusterctl requests` and the cluster's events show it, "by": "budget"), through the same
services a user's `stop`, `down` and `jobs cancel` use, waited for with a timeout."""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from clusterd.managed.controller import ManagedJobController
from clusterd.requests import RequestManager, RunningRequest
from clusterd.services.clusters import ClusterService

STEP_TIMEOUT_S = 1800.0  # a stop or teardown, at most


class RequestActions:
    def __init__(self, requests: RequestManager, clusters: ClusterService,
                 managed: ManagedJobController) -> None:
        self._requests = requests
        self._clusters = clusters
        self._managed = managed

    async def stop(self, cluster: str, reason: str) -> None:
        await self._request("stop", cluster, functools.partial(
            self._clusters.stop, name=cluster, reason=reason))

    async def down(self, cluster: str, reason: str) -> None:
        await self._request("down", cluster, functools.partial(
            self._clusters.down, name=cluster, purge=False, reason=reason))

    async def cancel_managed_job(self, job_id: int, reason: str) -> None:
        # The job's driver tears its cluster down and ends it CANCELLED.
        await self._managed.cancel([job_id], False)

    async def _request(self, op: str, cluster: str,
                       work: Callable[[RunningRequest], Awaitable[dict[str, Any]]]) -> None:
        request = await self._requests.start(op, cluster, {"cluster": cluster, "by": "budget"},
                                             work)
        with anyio.fail_after(STEP_TIMEOUT_S):
            await request.done.wait()
        request.outcome()  # raises what the request failed with
