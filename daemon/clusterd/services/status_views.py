"""`status`: clusters as views, cached per version of their records.

Records are replaced, never changed in place, so the part of a view drawn from a record is
built once per version of it, and encoded once (clusterd/packing.py): status is the hot path,
and thousands of clusters make it show. A refresh stamp changes only `refreshed_at` (the
record's `unstamped` stays the same): its view is re-encoded in that field alone.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.locks import ClusterLocks
from clusterd.packing import Packed
from clusterd.services.common import require_cluster
from clusterd.state.clusters import ClusterRecord, ClusterStore


class StatusViews:
    def __init__(self, store: ClusterStore, locks: ClusterLocks,
                 autostopping: dict[str, int]) -> None:
        self._store = store
        self._locks = locks
        # Cluster -> the autostop request stopping it now (the autostop service's, shared).
        self._autostopping = autostopping
        # Cluster -> (the record its view was made of, the view): status and status -v.
        self._views: dict[str, tuple[ClusterRecord, Packed]] = {}
        self._brief_views: dict[str, tuple[ClusterRecord, Packed]] = {}

    def view(self, record: ClusterRecord, verbose: bool = True) -> dict[str, Any]:
        """A cluster as `status` shows it: from the cache, unless its record changed."""
        views = self._views if verbose else self._brief_views
        cached = views.get(record.name)
        unstamped = record.unstamped
        if cached is None or cached[0] is not unstamped:
            # Encoded once too: a reply of many views joins their bytes (clusterd/packing.py).
            cached = views[record.name] = (unstamped,
                                           Packed(self._record_view(record, verbose)))
        elif cached[1]["refreshed_at"] != record.refreshed_at:
            # Only a refresh stamp since: its last field, not the whole view, is made again.
            cached = views[record.name] = (unstamped, cached[1].with_last(record.refreshed_at))
        base = cached[1]
        holders = self._locks.holders(record.name)
        if not holders and record.name not in self._autostopping:
            return base
        return {**base, "autostopping": record.name in self._autostopping,
                "busy": [h.describe() for h in holders]}

    def _record_view(self, record: ClusterRecord, verbose: bool) -> dict[str, Any]:
        placed = record.launched_resources
        view: dict[str, Any] = {
            "name": record.name,
            "provider": record.provider,
            "infra": _infra_text(record),
            "status": str(record.status),
            "status_reason": record.status_reason,
            "num_nodes": record.num_nodes,
            "cpus": placed and placed.cpus,
            "memory_gb": placed and placed.memory_gb,
            "instance_type": placed and placed.instance_type,
            "region": placed and placed.region,
            "zone": placed and placed.zone,
            "spot": bool(placed and placed.spot),
            # What the catalog says the cluster costs while it runs (all nodes), if it knows.
            "price_per_hour": (round(placed.price_per_hour * record.num_nodes, 4)
                               if placed and placed.price_per_hour else None),
            "launched_at": record.launched_at,
            "autostop_minutes": record.autostop_minutes,
            "autostop_down": record.autostop_down,
            "autostop_wait_for": record.autostop_wait_for,
            "autostop_deadline": record.autostop_deadline,
            "autostopping": False,
            "busy": [],
        }
        if verbose:  # what only -v shows is the bulk of a reply of many views
            view.update({
                "resources": record.requested_resources.view(),
                "status_updated_at": record.status_updated_at,
                "cloud_name": record.cloud_name,
                "hosts": [str(h) for h in (record.handle.provider.held_hosts()
                                           if record.handle.provider is not None else ())],
                "tunnel": (dataclasses.asdict(record.handle.tunnel)
                           if record.handle.tunnel is not None else None),
            })
        view["refreshed_at"] = record.refreshed_at  # last: see Packed.with_last
        return view

    def status(self, names: list[str], verbose: bool = True) -> dict[str, Any]:
        for name in names:
            require_cluster(self._store, name)
        records = [self._store.get(n) for n in names] if names else self._store.all()
        # Views of clusters gone, checked by count: a status of 10,000 clusters must not
        # build sets of them each time (one gone while another is new goes on the next).
        for views in (self._views, self._brief_views):
            if len(views) > self._store.count():
                for gone in views.keys() - set(self._store.names()):
                    del views[gone]
        return {"clusters": [self.view(r, verbose) for r in records if r is not None]}



def _infra_text(record: ClusterRecord) -> str:
    """Where the cluster is (as placed: provider/region/zone), else where it was asked for."""
    placed = record.launched_resources
    if placed is not None:
        return placed.infra
    asked = str(record.requested_resources.resources.infra)
    return asked if asked != "*" else record.provider
