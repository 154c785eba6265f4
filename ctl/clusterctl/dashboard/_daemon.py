"""The dashboard's side of the socket: connections to clusterd, and the shared feeds every open
page draws on (the clusters overview, the events of all clusters, notices).

One shared connection carries the quick calls; every stream that a browser consumes at its
own pace (a job's log, a request's progress) gets a connection of its own, so a slow tab holds
up nothing but itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar

from clusterctl import protocol
from clusterctl._version import __version__
from clusterctl.aio import AsyncClient, AsyncStream
from clusterctl.client import ClusterdError

CLIENT_NAME = f"clusterctl-dashboard/{__version__}"
OVERVIEW_INTERVAL_S = 1.0
EVENTS_KEPT = 1000
RECONNECT_S = 1.0

T = TypeVar("T")


class Broadcast(Generic[T]):
    """A value many waiters follow: each sees every new version, or the latest if it fell
    behind."""

    def __init__(self, value: T) -> None:
        self.value = value
        self.version = 0
        self._changed = asyncio.Event()

    def publish(self, value: T) -> None:
        self.value = value
        self.version += 1
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    async def next(self, seen: int) -> int:
        """Wait for a version newer than `seen`; return it."""
        while self.version == seen:
            await self._changed.wait()
        return self.version


class DaemonLink:
    def __init__(self, socket_path: str, autostart: bool | None = None) -> None:
        self.socket_path = socket_path
        # A daemon that went away comes back on the next call, as for clusterctl's commands.
        self._autostart = autostart
        self._shared: AsyncClient | None = None
        self._lock = asyncio.Lock()
        # Whether clusterd answers, and if not, why (every page shows it).
        self.health: Broadcast[tuple[bool, str]] = Broadcast((True, ""))

    async def _client(self) -> AsyncClient:
        async with self._lock:
            if self._shared is None or not self._shared.connected:
                if self._shared is not None:
                    await self._shared.close()
                    self._shared = None
                client = AsyncClient(self.socket_path, client_name=CLIENT_NAME,
                                     autostart=self._autostart)
                await client.connect()
                self._shared = client
            return self._shared

    async def call(self, args: protocol.OpArgs) -> dict[str, Any]:
        client = await self._client()
        try:
            return await client.call(args)
        except ClusterdError as exc:
            if client.connected or exc.code not in ("DAEMON_UNAVAILABLE", "IDLE_TIMEOUT"):
                raise
        # The connection closed under the call (the daemon closes idle ones): once more, on
        # a new one (every call the dashboard makes may be made twice).
        return await (await self._client()).call(args)

    @contextlib.asynccontextmanager
    async def stream(self, args: protocol.OpArgs) -> AsyncIterator[AsyncStream]:
        """A stream on a connection of its own, closed with it."""
        client = AsyncClient(self.socket_path, client_name=CLIENT_NAME,
                             autostart=self._autostart)
        await client.connect()
        try:
            async with client.stream(args) as stream:
                yield stream
        finally:
            await client.close()

    async def notices(self) -> list[protocol.Notice]:
        """What the daemon wants said to its user now (a budget past its warning): its
        hello's `alerts`, on a connection of its own (the shared one heard them once)."""
        client = AsyncClient(self.socket_path, client_name=CLIENT_NAME,
                             autostart=self._autostart)
        try:
            await client.connect()
            return protocol.alerts_of(client.server_hello)
        finally:
            await client.close()

    def note_health(self, ok: bool, why: str = "") -> None:
        if self.health.value != (ok, why):
            self.health.publish((ok, why))

    async def close(self) -> None:
        if self._shared is not None:
            await self._shared.close()


class Overview:
    """What the clusters page shows: clusters, orphans, requests in flight."""

    def __init__(self, clusters: list[dict[str, Any]], orphans: list[dict[str, Any]],
                 requests: list[dict[str, Any]]) -> None:
        self.clusters = clusters
        self.orphans = orphans
        self.requests = requests
        self.fetched_at = time.monotonic()

    def same_as(self, other: Overview | None) -> bool:
        return other is not None and (self.clusters, self.orphans, self.requests) == (
            other.clusters, other.orphans, other.requests)


class OverviewFeed:
    """Fetches the overview every second while a clusters page is open (at once after a
    cluster event), and publishes it when it changed."""

    def __init__(self, link: DaemonLink, interval_s: float = OVERVIEW_INTERVAL_S) -> None:
        self._link = link
        self._interval_s = interval_s
        self.snapshot: Broadcast[Overview | None] = Broadcast(None)
        self._watchers = 0
        self._wake = asyncio.Event()
        self._fetching = asyncio.Lock()

    def poke(self) -> None:
        self._wake.set()

    @contextlib.contextmanager
    def watching(self) -> Any:
        self._watchers += 1
        self.poke()
        try:
            yield
        finally:
            self._watchers -= 1

    async def fresh(self, max_age_s: float = 0.5) -> Overview:
        """The overview, fetched now unless the latest is younger than `max_age_s`."""
        async with self._fetching:
            latest = self.snapshot.value
            if latest is not None and time.monotonic() - latest.fetched_at <= max_age_s:
                return latest
            status, requests = await asyncio.gather(
                self._link.call(protocol.StatusArgs()), self._link.call(protocol.RequestsArgs()))
            overview = Overview(status.get("clusters", []), status.get("orphans", []),
                                requests.get("running", []))
            if not overview.same_as(latest):
                self.snapshot.publish(overview)
            elif latest is not None:
                latest.fetched_at = overview.fetched_at
            return overview

    async def run(self) -> None:
        while True:
            if self._watchers == 0:
                self._wake.clear()
                await self._wake.wait()
            self._wake.clear()
            try:
                await self.fresh(max_age_s=0)
                self._link.note_health(True)
            except ClusterdError as exc:
                self._link.note_health(False, exc.message)
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval_s):
                    await self._wake.wait()


class EventsFeed:
    """Every cluster event, live: one `events --follow` stream, resumed when it breaks."""

    def __init__(self, link: DaemonLink, overview: OverviewFeed) -> None:
        self._link = link
        self._overview = overview
        self.events: deque[dict[str, Any]] = deque(maxlen=EVENTS_KEPT)
        self.latest: Broadcast[int] = Broadcast(0)  # the newest event id

    def after(self, event_id: int, cluster: str | None = None) -> list[dict[str, Any]]:
        """Events newer than `event_id` (of one cluster), oldest first."""
        return [e for e in self.events
                if e["id"] > event_id and (cluster is None or e["cluster"] == cluster)]

    async def run(self) -> None:
        while True:
            try:
                async with self._link.stream(protocol.EventsArgs(limit=200, follow=True)
                                             ) as stream:
                    self._link.note_health(True)
                    async for name, data in stream:
                        if name == "cluster_event" and data.get("id", 0) > self.latest.value:
                            self.events.append(data)
                            self.latest.publish(int(data["id"]))
                            self._overview.poke()
            except ClusterdError as exc:
                self._link.note_health(False, exc.message)
            await asyncio.sleep(RECONNECT_S)


class Notices:
    """Messages for every open page: how actions started here ended (errors with the
    daemon's message and hint)."""

    def __init__(self) -> None:
        self.items: deque[dict[str, Any]] = deque(maxlen=50)
        self.latest: Broadcast[int] = Broadcast(0)

    def add(self, level: str, message: str, hint: str = "") -> None:
        self.items.append({"id": self.latest.version + 1, "level": level,
                           "message": message, "hint": hint})
        self.latest.publish(self.latest.version + 1)

    def after(self, notice_id: int) -> list[dict[str, Any]]:
        return [n for n in self.items if n["id"] > notice_id]
