"""Per-cluster locks held by requests.

launch/start/stop/down hold a cluster exclusively; exec holds it shared, so execs never wait
for each other. Waiters are granted in arrival order (a queued exclusive request is not starved
by a stream of shared ones). Every wait is bounded, a waiter learns what blocks it, and a
`down`/`stop` can pre-empt launches still waiting in the queue. A holder may also make what
it does interruptible (`Grant.interruptible`), so that a `down` can call off a launch that
holds the lock already, in whatever phase it is.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import math
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Collection, Iterator

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError


class LockMode(enum.Enum):
    SHARED = "shared"
    EXCLUSIVE = "exclusive"


@dataclasses.dataclass(frozen=True)
class Holder:
    request_id: int
    op: str
    mode: LockMode

    def describe(self) -> str:
        return f"request {self.request_id} ({self.op})"


@dataclasses.dataclass(eq=False)
class _Waiter:
    holder: Holder
    event: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    granted: bool = False
    preempted_by: Holder | None = None


@dataclasses.dataclass(eq=False)
class _Interruptible:
    scope: anyio.CancelScope = dataclasses.field(default_factory=anyio.CancelScope)
    called_off_by: Holder | None = None


@dataclasses.dataclass
class _ClusterLock:
    holders: dict[int, Holder] = dataclasses.field(default_factory=dict)
    waiters: deque[_Waiter] = dataclasses.field(default_factory=deque)
    # Holders' interruptible work, by request id: made on entering it, or by a call-off
    # that came first (between the grant and the holder's next step), which it then meets.
    interruptible: dict[int, _Interruptible] = dataclasses.field(default_factory=dict)

    def _fits(self, mode: LockMode) -> bool:
        if mode == LockMode.EXCLUSIVE:
            return not self.holders
        return all(h.mode == LockMode.SHARED for h in self.holders.values())

    def grant_waiting(self) -> None:
        while self.waiters and self._fits(self.waiters[0].holder.mode):
            waiter = self.waiters.popleft()
            self.holders[waiter.holder.request_id] = waiter.holder
            waiter.granted = True
            waiter.event.set()

    def blockers(self, waiter: _Waiter) -> list[Holder]:
        ahead: list[Holder] = []
        for queued in self.waiters:
            if queued is waiter:
                break
            ahead.append(queued.holder)
        conflicting = [
            h for h in self.holders.values()
            if waiter.holder.mode == LockMode.EXCLUSIVE or h.mode == LockMode.EXCLUSIVE
        ]
        return conflicting + ahead


def _blocked_message(cluster: str, blockers: list[Holder]) -> str:
    if not blockers:
        return f"waiting for cluster {cluster}"
    listed = ", ".join(h.describe() for h in blockers)
    return f"cluster {cluster} is busy: blocked by {listed}"


class Grant:
    """A held lock. `downgrade` turns exclusive into shared, letting queued execs in."""

    def __init__(self, locks: ClusterLocks, cluster: str, holder: Holder) -> None:
        self._locks = locks
        self.cluster = cluster
        self.holder = holder

    def downgrade(self) -> None:
        lock = self._locks._locks[self.cluster]
        self.holder = dataclasses.replace(self.holder, mode=LockMode.SHARED)
        lock.holders[self.holder.request_id] = self.holder
        lock.grant_waiting()

    @contextlib.contextmanager
    def interruptible(self, hint: str) -> Iterator[None]:
        """While inside, `ClusterLocks.call_off` may call this holder off: what runs inside
        is cancelled at its next checkpoint (its own clean-up runs then, shielded: it can ask
        `ClusterLocks.called_off` whether that is why), and leaving raises PREEMPTED naming
        the request that called it off, with `hint`. Called off before it got here, it is
        cancelled at once."""
        lock = self._locks._locks[self.cluster]
        entry = lock.interruptible.setdefault(self.holder.request_id, _Interruptible())
        try:
            with entry.scope:
                yield
        finally:
            lock.interruptible.pop(self.holder.request_id, None)
        if entry.called_off_by is not None:
            raise ProtocolError(
                ErrorCode.PREEMPTED,
                f"{self.holder.op} of {self.cluster} was called off by "
                f"{entry.called_off_by.describe()}", hint)


class ClusterLocks:
    def __init__(self, timeout_s: float, notice_after_s: float) -> None:
        self.timeout_s = timeout_s
        self.notice_after_s = notice_after_s
        self._locks: dict[str, _ClusterLock] = {}

    def holders(self, cluster: str) -> list[Holder]:
        lock = self._locks.get(cluster)
        return list(lock.holders.values()) if lock else []

    def waiting(self, cluster: str) -> list[Holder]:
        lock = self._locks.get(cluster)
        return [w.holder for w in lock.waiters] if lock else []

    @contextlib.asynccontextmanager
    async def hold(
        self,
        cluster: str,
        mode: LockMode,
        request_id: int,
        op: str,
        on_blocked: Callable[[str], Awaitable[None]] | None = None,
        timeout_s: float | None = None,
    ) -> AsyncIterator[Grant]:
        holder = Holder(request_id, op, mode)
        await self._acquire(cluster, holder, on_blocked, timeout_s or self.timeout_s)
        grant = Grant(self, cluster, holder)
        try:
            yield grant
        finally:
            self._release(cluster, request_id)

    def preempt_waiting(self, cluster: str, ops: Collection[str], by: Holder) -> list[Holder]:
        """Fail the queued (not yet granted) waiters of `ops` on `cluster`, naming `by`."""
        lock = self._locks.get(cluster)
        if lock is None:
            return []
        preempted = [w for w in lock.waiters if w.holder.op in ops]
        for waiter in preempted:
            lock.waiters.remove(waiter)
            waiter.preempted_by = by
            waiter.event.set()
        lock.grant_waiting()
        return [w.holder for w in preempted]

    def call_off(self, cluster: str, ops: Collection[str], by: Holder) -> list[Holder]:
        """Cancel what the holders of `ops` on `cluster` do inside `Grant.interruptible`
        (now, or as soon as they enter it), naming `by`; they keep the lock until their
        clean-up is done. Returns the holders called off (each only once)."""
        lock = self._locks.get(cluster)
        if lock is None:
            return []
        called = []
        for request_id, holder in lock.holders.items():
            if holder.op not in ops:
                continue
            entry = lock.interruptible.setdefault(request_id, _Interruptible())
            if entry.called_off_by is None:
                entry.called_off_by = by
                entry.scope.cancel()
                called.append(holder)
        return called

    def called_off(self, cluster: str, request_id: int) -> Holder | None:
        """Who called off the request's interruptible work on `cluster`, if anyone did."""
        lock = self._locks.get(cluster)
        entry = lock.interruptible.get(request_id) if lock else None
        return entry.called_off_by if entry else None

    async def _acquire(
        self,
        cluster: str,
        holder: Holder,
        on_blocked: Callable[[str], Awaitable[None]] | None,
        timeout_s: float,
    ) -> None:
        lock = self._locks.setdefault(cluster, _ClusterLock())
        waiter = _Waiter(holder)
        lock.waiters.append(waiter)
        lock.grant_waiting()
        if waiter.granted:
            return
        told = ""
        try:
            with anyio.fail_after(timeout_s):
                while not waiter.granted and waiter.preempted_by is None:
                    patience = self.notice_after_s if not told else math.inf
                    with anyio.move_on_after(patience):
                        await waiter.event.wait()
                    if waiter.granted or waiter.preempted_by is not None:
                        break
                    message = _blocked_message(cluster, lock.blockers(waiter))
                    if on_blocked is not None and message != told:
                        await on_blocked(message)
                    told = message
        except TimeoutError:
            blockers = lock.blockers(waiter)
            raise ProtocolError(
                ErrorCode.LOCK_TIMEOUT,
                f"gave up after {timeout_s:.0f} s: "
                + _blocked_message(cluster, blockers),
                "try again when it finishes, or see `clusterctl requests`",
            ) from None
        except BaseException:
            if waiter.granted:
                self._release(cluster, holder.request_id)
            raise
        finally:
            if not waiter.granted:
                with contextlib.suppress(ValueError):
                    lock.waiters.remove(waiter)
                lock.grant_waiting()
                self._forget_if_idle(cluster)
        if waiter.preempted_by is not None:
            raise ProtocolError(
                ErrorCode.PREEMPTED,
                f"{holder.op} of {cluster} was pre-empted by {waiter.preempted_by.describe()}",
                f"launch {cluster} again once that finishes",
            )

    def _release(self, cluster: str, request_id: int) -> None:
        lock = self._locks.get(cluster)
        if lock is None:
            return
        lock.holders.pop(request_id, None)
        lock.interruptible.pop(request_id, None)
        lock.grant_waiting()
        self._forget_if_idle(cluster)

    def _forget_if_idle(self, cluster: str) -> None:
        lock = self._locks.get(cluster)
        if lock is not None and not lock.holders and not lock.waiters:
            del self._locks[cluster]
