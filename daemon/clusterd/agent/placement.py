"""Placement groups kept for a moment after their job, for the next job of the same shape.

Ray frees a removed group's resources on its nodes at once, but the GCS learns of it only from
the nodes' next resource report, and a group that did not fit at its first attempt is tried
again on a later pass of the GCS's scheduling, up to a second on. So a job submitted right
after another finished waited ~1 s for its reservation: 2 of 15 back-to-back `exec`s on a
warm local cluster, and every job of a queued batch once the cluster was full. A finished
job's group is parked instead, for PARK_S, and handed to the next job asking for the same
bundles, which then starts with no reservation to wait for, on the nodes it had.

A job already waiting for a reservation of the same shape is handed the group at once (its
own request withdrawn). A parked group holds its resources: the scheduler parks only when no
job is waiting for a reservation, and a job of another shape has every parked group removed
first.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import anyio
import anyio.abc
import ray
from ray.util.placement_group import remove_placement_group

from clusterd import log
from clusterd.agent.runner import NodeSlot

logger = log.get("clusterd.agent.placement")

PARK_S = 2.0  # long enough for a script's next `exec` or a queue's next job, short for others

Shape = tuple[tuple[tuple[str, float], ...], ...]


def shape_of(bundles: Sequence[dict[str, float]]) -> Shape:
    return tuple(tuple(sorted(bundle.items())) for bundle in bundles)


@dataclasses.dataclass(eq=False)  # parked entries are told apart by identity
class _Parked:
    group: Any
    shape: Shape
    slots: list[NodeSlot]  # where its bundles are, as worked out for the job before


class PlacementPool:
    def __init__(self, park_s: float = PARK_S) -> None:
        self._park_s = park_s
        self._parked: list[_Parked] = []

    async def take(self, shape: Shape) -> tuple[Any, list[NodeSlot]] | None:
        """A parked group of this shape that Ray still holds reserved, and its slots; or
        None."""
        while entry := next((p for p in self._parked if p.shape == shape), None):
            self._parked.remove(entry)
            table = await anyio.to_thread.run_sync(ray.util.placement_group_table, entry.group,
                                                   abandon_on_cancel=True)
            if table.get("state") == "CREATED":  # not rescheduling after a node was lost
                return entry.group, entry.slots
            await remove(entry.group)
        return None

    async def release_all(self) -> None:
        """Remove every parked group (a job of another shape may need what they hold)."""
        parked, self._parked = self._parked, []
        for entry in parked:
            await remove(entry.group)

    def park(self, group: Any, shape: Shape, slots: list[NodeSlot],
             task_group: anyio.abc.TaskGroup) -> None:
        entry = _Parked(group, shape, slots)
        self._parked.append(entry)
        task_group.start_soon(self._expire, entry, name="placement-expiry")

    async def _expire(self, entry: _Parked) -> None:
        await anyio.sleep(self._park_s)
        if entry in self._parked:
            self._parked.remove(entry)
            await remove(entry.group)


async def remove(group: Any) -> None:
    try:
        await anyio.to_thread.run_sync(remove_placement_group, group)
    except ray.exceptions.RayError as exc:  # the GCS is going away with the cluster
        logger.warning("cannot remove a placement group", error=str(exc))
