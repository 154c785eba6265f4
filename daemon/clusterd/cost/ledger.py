"""The cost ledger: every stretch of a cluster's nodes running, or stopped and paying for their
disks, at the price that applied, written to the state database as it happens.

An interval opens when a cluster's nodes start (a launch that has its nodes, a start) and
closes when they stop, go down, or are found gone by refresh. The services call one hook per
change (`running`, `stopped`, `ended`, and refresh's `observed`); each hook is idempotent: it
makes the open intervals what the cluster now is, closing and opening as needed, so calling
it twice, or again after a restart, changes nothing.

kill -9: an open interval stays open in the database (its nodes kept running while the
daemon was away); the first refresh after a restart finds what changed meanwhile and dates
the change by the provider's own clock where it has one (NodeInfo.launched_at/stopped_at:
EC2's LaunchTime and StateTransitionReason, a pod's start and finish), else at the time it
was first seen. A launch or start dates its nodes' start the same way. No second is counted
twice: a unique index holds at most one open interval per cluster and kind, an interval
closes no earlier than it opened, and one opens no earlier than the cluster's last one
closed (a provider's time before that is clamped to it, never after now).

Incarnations: a cluster made again under the same name is another cluster; its intervals
carry the record's `created_at` (`incarnation`).
"""

from __future__ import annotations

import dataclasses
import datetime
import time
from collections.abc import Sequence
from typing import Any

import anyio

from clusterd.cost.prices import NodePrice, Prices
from clusterd.nodes import NodeInfo, NodeStatus
from clusterd.state.clusters import ClusterRecord
from clusterd.state.db import Database

RUNNING = "running"
STOPPED = "stopped"
# When a change happened: a time (the daemon's, or the provider's for the change as a whole:
# changed_at); or, for a change made to every node at once (a launch, a start, a stop, a
# down), each node's time by the provider (node_times), dated at the mean of those after the
# stretch it ends began: nodes take it moments apart (separate calls; EC2's times are to the
# second), and the mean makes one interval count their node-seconds exactly; None: now.
When = float | tuple[float, ...] | None
# What one interval-second costs, in SQL over a row of cost_intervals (per hour: / 3600).
_RATE_SQL = ("nodes * (disk_price_per_hour"
             " + CASE kind WHEN 'running' THEN node_price_per_hour ELSE 0 END)")
# The first UTC midnight after a piece's start (POSIX days are 86,400 s; start > 0).
_NEXT_MIDNIGHT = "(CAST(start / 86400 AS INTEGER) + 1) * 86400.0"


def utc_date(day: int) -> str:
    """A POSIX day number (seconds // 86400) as its UTC date, YYYY-MM-DD."""
    return datetime.datetime.fromtimestamp(day * 86400, datetime.UTC).date().isoformat()


@dataclasses.dataclass(frozen=True)
class Interval:
    cluster: str
    incarnation: float  # the cluster record's created_at
    cloud_name: str
    provider: str
    infra: str
    instance_type: str | None
    nodes: int
    kind: str  # RUNNING or STOPPED
    started_at: float
    ended_at: float | None
    node_price_per_hour: float
    disk_price_per_hour: float
    source: str
    owner: str | None = None
    id: int = 0

    @property
    def rate(self) -> float:
        """Dollars per hour while this interval lasts (all its nodes)."""
        node = self.node_price_per_hour if self.kind == RUNNING else 0.0
        return self.nodes * (node + self.disk_price_per_hour)

    def cost(self, now: float, since: float = 0.0, until: float | None = None) -> float:
        """Dollars over [since, until] (an open interval accrues to `now`)."""
        end = min(self.ended_at if self.ended_at is not None else now,
                  until if until is not None else now)
        seconds = max(0.0, end - max(self.started_at, since))
        return self.rate * seconds / 3600

    def to_wire(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_FIELDS = [f.name for f in dataclasses.fields(Interval) if f.name != "id"]
# Every column in the order of Interval's fields: a row becomes an Interval by position (a
# report reads tens of thousands).
INTERVAL_COLUMNS = ", ".join(f.name for f in dataclasses.fields(Interval))


class Ledger:
    def __init__(self, db: Database, prices: Prices) -> None:
        self._db = db
        self._prices = prices
        self.prices = prices  # what a placement costs, as the ledger counts it (--dryrun)
        self._lock = anyio.Lock()  # one hook's read-then-write at a time
        # cluster -> kind -> its open interval (by cluster: status asks for thousands);
        # (cluster, incarnation) -> closed dollars.
        self._open: dict[str, dict[str, Interval]] = {}
        self._closed: dict[tuple[str, float], float] = {}
        self._closed_by_owner: dict[str, float] = {}  # a managed job's attempts, all told
        # cluster -> when its last closed interval ended: where a new one may open, at the
        # earliest (one per cluster name ever seen: a float each).
        self._last_end: dict[str, float] = {}

    async def load(self) -> None:
        rows = await self._db.fetchall(
            f"SELECT {INTERVAL_COLUMNS} FROM cost_intervals WHERE ended_at IS NULL")
        self._open = {}
        for row in rows:
            interval = Interval(*row)
            self._open.setdefault(interval.cluster, {})[interval.kind] = interval
        await self._load_closed()

    async def _load_closed(self) -> None:
        sums = await self._db.fetchall(
            f"SELECT cluster, incarnation, SUM({_RATE_SQL} * (ended_at - started_at)) / 3600"
            " AS dollars FROM cost_intervals WHERE ended_at IS NOT NULL"
            " GROUP BY cluster, incarnation")
        self._closed = {(row["cluster"], row["incarnation"]): row["dollars"] for row in sums}
        owners = await self._db.fetchall(
            f"SELECT owner, SUM({_RATE_SQL} * (ended_at - started_at)) / 3600 AS dollars"
            " FROM cost_intervals WHERE ended_at IS NOT NULL AND owner IS NOT NULL"
            " GROUP BY owner")
        self._closed_by_owner = {row["owner"]: row["dollars"] for row in owners}
        ends = await self._db.fetchall(
            "SELECT cluster, MAX(ended_at) AS ended_at FROM cost_intervals"
            " WHERE ended_at IS NOT NULL GROUP BY cluster")
        self._last_end = {row["cluster"]: row["ended_at"] for row in ends}

    async def prune(self, before: float) -> int:
        """Forget cluster incarnations that are gone (no live record, nothing open) and
        ended before `before`: their intervals and settled split. The ledger's bound, as
        finished requests and events have theirs. Open intervals, and a live cluster's past
        (its cost so far), stay. Returns how many intervals went."""
        async with self._lock:  # no hook's close between the delete and the sums below
            before_rows = await self._db.fetchall("SELECT COUNT(*) AS n FROM cost_intervals")
            # Whole incarnations go (a settled split is over all of one, and goes with it).
            await self._db.write([(
                "DELETE FROM cost_intervals WHERE (cluster, incarnation) IN ("
                " SELECT cluster, incarnation FROM cost_intervals AS i"
                "  WHERE NOT EXISTS (SELECT 1 FROM clusters c"
                "   WHERE c.name = i.cluster AND c.created_at = i.incarnation)"
                "  GROUP BY cluster, incarnation"
                "  HAVING COUNT(ended_at) = COUNT(*) AND MAX(ended_at) < ?)", [before]), (
                "DELETE FROM cost_settled WHERE NOT EXISTS (SELECT 1 FROM cost_intervals i"
                " WHERE i.cluster = cost_settled.cluster"
                " AND i.incarnation = cost_settled.incarnation)", [])])
            after_rows = await self._db.fetchall("SELECT COUNT(*) AS n FROM cost_intervals")
            removed = int(before_rows[0]["n"]) - int(after_rows[0]["n"])
            if removed:
                await self._load_closed()  # the sums held in memory shrink with the table
            return removed

    # -- the hooks ---------------------------------------------------------------------------

    async def running(self, record: ClusterRecord, nodes: int | None = None,
                      at: When = None) -> None:
        """The cluster's nodes run (`nodes` of them; default all): one open running interval
        at today's price, its stopped one (if any) closed. `at`: when they started, where the
        provider says (an `at` before the stretch it would end is an earlier start's, and
        ignored: a provider that keeps its first launch time across a stop and start must
        not have the stopped stretch counted as running)."""
        await self._become(record, RUNNING, record.num_nodes if nodes is None else nodes, at)

    async def stopped(self, record: ClusterRecord, at: When = None) -> None:
        """The cluster's nodes stopped: its disks go on costing."""
        await self._become(record, STOPPED, record.num_nodes, at)

    async def ended(self, name: str, at: When = None) -> None:
        """The cluster is gone (down, or every node terminated): nothing open."""
        await self._become_nothing(name, at)

    async def observed(self, record: ClusterRecord, nodes: Sequence[NodeInfo]) -> None:
        """What refresh found of the cluster's nodes, as the ledger should count it: none
        left, every one stopped, or so many running (a node not stopped nor gone is paid
        for, answering or not)."""
        alive = [n for n in nodes if n.status != NodeStatus.TERMINATED]
        at = changed_at(nodes)
        if not alive:
            await self.ended(record.name, at)
        elif all(n.status == NodeStatus.STOPPED for n in alive):
            await self.stopped(record, at)
        else:
            running = sum(1 for n in alive if n.status != NodeStatus.STOPPED)
            await self.running(record, running, at)

    # -- what the budgets and reports read -----------------------------------------------

    async def spend(self, since: float, until: float | None = None,
                    provider: str | None = None) -> float:
        """Dollars spent in [since, until] (None: now), on one provider or all; open
        intervals accrue to now."""
        now = time.time()
        until_at = now if until is None else until
        where, params = self._provider_filter(provider)
        rows = await self._db.fetchall(
            f"SELECT SUM({_RATE_SQL} * (MIN(COALESCE(ended_at, ?), ?) - MAX(started_at, ?)))"
            " / 3600 AS dollars FROM cost_intervals"
            f" WHERE started_at < ? AND (ended_at IS NULL OR ended_at > ?){where}",
            [now, until_at, since, until_at, since, *params])
        return float(rows[0]["dollars"] or 0.0) if rows else 0.0

    async def burn_rate(self, provider: str | None = None) -> float:
        """Dollars per hour of what runs (and what sits stopped) now."""
        return sum(i.rate for i in self._all_open()
                   if provider is None or i.provider == provider)

    async def spenders(self, provider: str | None = None) -> list[str]:
        """Clusters with an open interval (running, or stopped with disks), by name."""
        return sorted({i.cluster for i in self._all_open()
                       if provider is None or i.provider == provider})

    def open_intervals(self, name: str) -> list[Interval]:
        return list(self._open.get(name, {}).values())

    def _all_open(self) -> list[Interval]:
        return [i for kinds in self._open.values() for i in kinds.values()]

    def cost_so_far(self, record: ClusterRecord, now: float | None = None) -> float:
        """Dollars this incarnation of the cluster has cost, to now."""
        now = time.time() if now is None else now
        closed = self._closed.get((record.name, record.created_at), 0.0)
        return closed + sum(i.cost(now) for i in self.open_intervals(record.name)
                            if i.incarnation == record.created_at)

    def owner_cost(self, owner: str, now: float | None = None) -> float:
        """Dollars every cluster `owner` (a managed job) made has cost, to now."""
        now = time.time() if now is None else now
        return self._closed_by_owner.get(owner, 0.0) + sum(
            i.cost(now) for i in self._all_open() if i.owner == owner)

    def rate(self, name: str) -> float:
        """Dollars per hour the cluster costs now."""
        return sum(i.rate for i in self.open_intervals(name))

    async def intervals(self, since: float) -> list[Interval]:
        """Every interval that lasted past `since` (open ones too), oldest first."""
        rows = await self._db.fetchall(
            f"SELECT {INTERVAL_COLUMNS} FROM cost_intervals WHERE ended_at IS NULL OR ended_at > ?"
            " ORDER BY started_at, id", [since])
        return [Interval(*row) for row in rows]

    async def spend_by_day(self, since: float, now: float) -> dict[str, dict[str, float]]:
        """Dollars per UTC day (YYYY-MM-DD) and provider from `since` to `now` (open
        intervals accrue to now), as attribution.by_day_and_provider cuts intervals at
        midnights, summed in SQL: a report over months reads a row per day and provider, not
        per interval."""
        rows = await self._db.fetchall(
            "WITH RECURSIVE pieces(start, finish, rate, provider) AS ("
            f" SELECT MAX(started_at, ?), COALESCE(ended_at, ?), {_RATE_SQL} / 3600.0,"
            "  provider FROM cost_intervals WHERE ended_at IS NULL OR ended_at > ?"
            f" UNION ALL SELECT {_NEXT_MIDNIGHT}, finish, rate, provider FROM pieces"
            f"  WHERE {_NEXT_MIDNIGHT} < finish)"
            f" SELECT CAST(start / 86400 AS INTEGER) AS day, provider,"
            f" TOTAL(rate * (MIN(finish, {_NEXT_MIDNIGHT}) - start)) FROM pieces"
            " WHERE finish > start GROUP BY day, provider ORDER BY day, provider",
            [since, now, since])
        found: dict[str, dict[str, float]] = {}
        for day, provider, dollars in rows:
            found.setdefault(utc_date(day), {})[provider] = dollars
        return found

    # -- inside ------------------------------------------------------------------------------

    @staticmethod
    def _provider_filter(provider: str | None) -> tuple[str, list[Any]]:
        return ("", []) if provider is None else (" AND provider = ?", [provider])

    def _wanted(self, record: ClusterRecord, kind: str, nodes: int) -> Interval:
        price: NodePrice = self._prices.node(record.launched_resources,
                                             record.requested_resources)
        placed = record.launched_resources
        return Interval(
            cluster=record.name, incarnation=record.created_at, cloud_name=record.cloud_name,
            provider=record.provider, infra=placed.infra if placed else record.provider,
            instance_type=placed.instance_type if placed else None, nodes=nodes, kind=kind,
            started_at=0.0, ended_at=None, node_price_per_hour=price.node_per_hour,
            disk_price_per_hour=price.disk_per_hour, source=price.source, owner=record.owner)

    async def _become(self, record: ClusterRecord, kind: str, nodes: int,
                      at: When) -> None:
        async with self._lock:
            current = self._open.get(record.name, {}).get(kind)
            # Refresh calls this for every cluster every cycle: the common case (nothing
            # changed) reads no price (a pools file, say) and writes nothing.
            if current is not None and _same(current, record.created_at, nodes):
                stale = [i for i in self.open_intervals(record.name) if i.kind != kind]
                if stale:
                    await self._close(stale, self._dated(record.name, stale, at, kind))
                return
            closing = self.open_intervals(record.name)
            when = self._dated(record.name, closing, at, kind)
            await self._close(closing, when)
            opened = dataclasses.replace(self._wanted(record, kind, nodes), started_at=when)
            row_id = await self._db.write([(
                f"INSERT INTO cost_intervals ({', '.join(_FIELDS)})"
                f" VALUES ({', '.join('?' for _ in _FIELDS)})",
                [getattr(opened, f) for f in _FIELDS])])
            self._open.setdefault(record.name, {})[kind] = dataclasses.replace(
                opened, id=row_id or 0)

    async def _become_nothing(self, name: str, at: When) -> None:
        async with self._lock:
            closing = self.open_intervals(name)
            await self._close(closing, self._dated(name, closing, at, None))

    def _dated(self, name: str, closing: list[Interval], at: When,
               kind: str | None) -> float:
        """When the cluster became `kind` (None: gone), given the provider's word `at`: never
        after now, never before what it ends began nor before the cluster's last interval
        ended. A start (`kind` RUNNING) dated before that is an earlier start's: now."""
        now = time.time()
        floor = max([i.started_at for i in closing] + [self._last_end.get(name, 0.0)])
        if isinstance(at, tuple):
            # The nodes this change moved: those whose time is after the floor (a node lost
            # before the stretch began, or one that kept running through a repair, was not).
            moved = [t for t in at if floor < t <= now]
            at = sum(moved) / len(moved) if moved else max(at, default=None)
        if at is None or at > now:
            return max(now, floor)
        if at < floor:
            return now if kind == RUNNING else floor
        return at

    async def _close(self, intervals: list[Interval], at: float) -> None:
        if not intervals:
            return
        # Never before it opened: a provider's clock (or ours) may be behind.
        ends = [max(at, i.started_at) for i in intervals]
        await self._db.write([("UPDATE cost_intervals SET ended_at = ? WHERE id = ?",
                               [end, i.id]) for i, end in zip(intervals, ends, strict=True)])
        for interval, end in zip(intervals, ends, strict=True):
            self._last_end[interval.cluster] = max(end, self._last_end.get(interval.cluster, 0.0))
            kinds = self._open.get(interval.cluster, {})
            kinds.pop(interval.kind, None)
            if not kinds:
                self._open.pop(interval.cluster, None)
            key = (interval.cluster, interval.incarnation)
            self._closed[key] = self._closed.get(key, 0.0) + interval.cost(end)
            if interval.owner is not None:
                self._closed_by_owner[interval.owner] = (
                    self._closed_by_owner.get(interval.owner, 0.0) + interval.cost(end))


def _same(current: Interval, incarnation: float, nodes: int) -> bool:
    """The open interval already counts this incarnation's `nodes` (a price change alone
    does not split an interval: the price is the one that applied when the nodes started)."""
    return (current.incarnation, current.nodes) == (incarnation, nodes)


def changed_at(nodes: Sequence[NodeInfo]) -> float | None:
    """When the cluster became what its nodes are now, by the provider's clock: when the
    last of them changed (a running node when it started, any other when it stopped or
    went). None when a node's time is not known (then the change is dated when seen)."""
    times = _node_times(nodes)
    return max(times) if times else None


def node_times(nodes: Sequence[NodeInfo]) -> tuple[float, ...] | None:
    """Each node's last change by the provider's clock (a running node's start, any other's
    stop or end), for a change made to all of them at once (see When); None when one is not
    known."""
    times = _node_times(nodes)
    return tuple(times) if times else None


def _node_times(nodes: Sequence[NodeInfo]) -> list[float] | None:
    times = [n.launched_at if _counts_as_running(n) else n.stopped_at for n in nodes]
    known = [t for t in times if t is not None]
    return known if times and len(known) == len(times) else None


def _counts_as_running(node: NodeInfo) -> bool:
    return node.status not in (NodeStatus.STOPPED, NodeStatus.TERMINATED)
