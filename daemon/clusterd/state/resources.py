"""The stored JSON of what records hold as typed data: placements (where a cluster was put, and
what its nodes have) and resource requests (what it was asked for).

Made and read here only, by the row mapping of state/ and managed/store.py; everywhere else
these are `Placement` and `ResourceRequest`, so mypy checks every use. The JSON's shape is the
one clusterd has always written (a placement's fields by name; a request's `view`), so a
database moves between this clusterd and an older one either way without a migration.
Reading is forgiving, as it has always been: a key an older clusterd did not write takes its
default, a key this one does not know is ignored.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any

from clusterd.providers.base import Placement
from clusterd.state.db import dumps, loads
from clusterd.tasks.spec import ResourceRequest

# Records share few distinct placements and requests (10,000 clusters of one task have one),
# and both are frozen: each text is made, and read, once, not per row (a status change maps
# its record to a row twice, to find the columns that changed).
_CACHED = 1024

_PLACEMENT_FIELDS = frozenset(f.name for f in dataclasses.fields(Placement))


def placement_json(placement: Placement) -> dict[str, Any]:
    return dataclasses.asdict(placement)


def load_placement(data: dict[str, Any] | None) -> Placement | None:
    """A stored placement; None for none, or for one that names no provider (a managed job's
    placement, written while its cluster was gone, kept every key empty). What an older
    clusterd left out is not known, and reads as nothing: a managed job's placement kept
    only where it was, its instance type and whether it was spot, so its sizes read 0."""
    if not data or not data.get("provider"):
        return None
    values = {k: v for k, v in data.items() if k in _PLACEMENT_FIELDS}
    for unknown in ("region", "zone", "instance_type"):
        values.setdefault(unknown, None)
    for size in ("cpus", "memory_gb", "accelerator_count", "price_per_hour"):
        if values.get(size) is None:
            values[size] = 0.0
    values["spot"] = bool(values.get("spot"))
    return Placement(**values)


@functools.lru_cache(_CACHED)
def placement_text(placement: Placement) -> str:
    return dumps(placement_json(placement))


@functools.lru_cache(_CACHED)
def placement_from_text(text: str | None) -> Placement | None:
    return load_placement(loads(text))


@functools.lru_cache(_CACHED)
def request_text(request: ResourceRequest) -> str:
    return dumps(request.view())


@functools.lru_cache(_CACHED)
def request_from_text(text: str | None) -> ResourceRequest:
    return ResourceRequest.from_view(loads(text) or {})
