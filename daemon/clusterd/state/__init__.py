"""The daemon's state: one SQLite database (WAL), with an in-memory view of live clusters."""

from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.db import Database
from clusterd.state.requests import RequestRecord, RequestStore

__all__ = ["ClusterRecord", "ClusterStore", "Database", "RequestRecord", "RequestStore"]
