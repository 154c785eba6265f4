"""Per-cluster request locks (clusterd.locks)."""

from __future__ import annotations

from typing import Any

import anyio
import pytest
from anyio import wait_all_tasks_blocked

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.locks import ClusterLocks, Holder, LockMode

pytestmark = pytest.mark.anyio

SHARED = LockMode.SHARED
EXCLUSIVE = LockMode.EXCLUSIVE


def ids(holders: list[Holder]) -> list[int]:
    return [h.request_id for h in holders]


class Client:
    """One request that takes the lock in a task and holds it until told to let go."""

    def __init__(self, locks: ClusterLocks, mode: LockMode, request_id: int, op: str,
                 log: list[str], **kwargs: Any) -> None:
        self.locks = locks
        self.mode = mode
        self.request_id = request_id
        self.op = op
        self.log = log
        self.kwargs = kwargs
        self.release = anyio.Event()
        self.error: ProtocolError | None = None

    async def run(self) -> None:
        try:
            async with self.locks.hold("dev", self.mode, self.request_id, self.op,
                                       **self.kwargs):
                self.log.append(f"got {self.request_id}")
                await self.release.wait()
            self.log.append(f"released {self.request_id}")
        except ProtocolError as exc:
            self.error = exc
            self.log.append(f"error {self.request_id}")


async def test_two_shared_holders_at_once() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    async with locks.hold("dev", SHARED, 1, "exec"), locks.hold("dev", SHARED, 2, "exec"):
        assert ids(locks.holders("dev")) == [1, 2]
        assert locks.waiting("dev") == []
    assert locks.holders("dev") == []


async def test_other_clusters_are_independent() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    async with locks.hold("a", EXCLUSIVE, 1, "launch"), locks.hold("b", EXCLUSIVE, 2, "launch"):
        assert ids(locks.holders("a")) == [1]
        assert ids(locks.holders("b")) == [2]


async def test_exclusive_waits_for_shared_then_gets_it() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    shared = Client(locks, SHARED, 1, "exec", log)
    exclusive = Client(locks, EXCLUSIVE, 2, "stop", log)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(shared.run)
            await wait_all_tasks_blocked()
            tg.start_soon(exclusive.run)
            await wait_all_tasks_blocked()
            assert log == ["got 1"]
            assert ids(locks.waiting("dev")) == [2]
            assert locks.waiting("dev")[0].mode == EXCLUSIVE
            shared.release.set()
            await wait_all_tasks_blocked()
            assert log == ["got 1", "released 1", "got 2"]
            assert ids(locks.holders("dev")) == [2]
            exclusive.release.set()
    assert locks.holders("dev") == []
    assert locks._locks == {}


async def test_waiters_are_granted_in_arrival_order() -> None:
    """A queued exclusive request is not overtaken by later shared ones."""
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    first = Client(locks, SHARED, 1, "exec", log)
    launch = Client(locks, EXCLUSIVE, 2, "launch", log)
    late_exec = Client(locks, SHARED, 3, "exec", log)
    stop = Client(locks, EXCLUSIVE, 4, "stop", log)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for client in (first, launch, late_exec, stop):
                tg.start_soon(client.run)
                await wait_all_tasks_blocked()
            # exec 3 is compatible with holder 1 but must queue behind launch 2.
            assert log == ["got 1"]
            assert ids(locks.waiting("dev")) == [2, 3, 4]
            first.release.set()
            await wait_all_tasks_blocked()
            assert log[-1] == "got 2"
            assert ids(locks.waiting("dev")) == [3, 4]
            launch.release.set()
            await wait_all_tasks_blocked()
            assert log[-1] == "got 3"
            assert ids(locks.holders("dev")) == [3]
            late_exec.release.set()
            await wait_all_tasks_blocked()
            assert log[-1] == "got 4"
            stop.release.set()
    assert log == ["got 1", "released 1", "got 2", "released 2", "got 3", "released 3",
                   "got 4", "released 4"]


async def test_on_blocked_names_the_blocking_request() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=0.05)
    notices: list[str] = []
    got_notice = anyio.Event()

    async def on_blocked(message: str) -> None:
        notices.append(message)
        got_notice.set()

    with anyio.fail_after(2):
        async with locks.hold("dev", EXCLUSIVE, 7, "launch") as grant:
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    async with locks.hold("dev", SHARED, 8, "exec", on_blocked=on_blocked):
                        notices.append("granted")

                tg.start_soon(waiter)
                await got_notice.wait()
                assert notices == ["cluster dev is busy: blocked by request 7 (launch)"]
                grant.downgrade()
            assert notices[-1] == "granted"
    assert len(notices) == 2


async def test_on_blocked_lists_holders_and_requests_queued_ahead() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=0.05)
    notices: list[str] = []
    got_notice = anyio.Event()

    async def on_blocked(message: str) -> None:
        notices.append(message)
        got_notice.set()

    log: list[str] = []
    holder = Client(locks, SHARED, 1, "exec", log)
    queued = Client(locks, EXCLUSIVE, 2, "stop", log)
    blocked = Client(locks, EXCLUSIVE, 3, "down", log, on_blocked=on_blocked)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for client in (holder, queued, blocked):
                tg.start_soon(client.run)
                await wait_all_tasks_blocked()
            await got_notice.wait()
            for client in (holder, queued, blocked):
                client.release.set()
    assert notices == [
        "cluster dev is busy: blocked by request 1 (exec), request 2 (stop)"
    ]


async def test_no_notice_when_granted_before_notice_after() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=10)
    notices: list[str] = []

    async def on_blocked(message: str) -> None:
        notices.append(message)

    log: list[str] = []
    holder = Client(locks, EXCLUSIVE, 1, "launch", log)
    waiter = Client(locks, EXCLUSIVE, 2, "exec", log, on_blocked=on_blocked)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(holder.run)
            await wait_all_tasks_blocked()
            tg.start_soon(waiter.run)
            await wait_all_tasks_blocked()
            holder.release.set()
            waiter.release.set()
    assert notices == []
    assert log == ["got 1", "released 1", "got 2", "released 2"]


async def test_timeout_raises_lock_timeout_and_leaves_no_waiter() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    with anyio.fail_after(2):
        async with locks.hold("dev", EXCLUSIVE, 1, "launch"):
            with pytest.raises(ProtocolError) as info:
                async with locks.hold("dev", SHARED, 2, "exec", timeout_s=0.05):
                    pytest.fail("must not be granted")
            assert info.value.code == ErrorCode.LOCK_TIMEOUT
            assert "cluster dev is busy: blocked by request 1 (launch)" in info.value.message
            assert info.value.message.startswith("gave up after ")
            assert info.value.hint
            assert locks.waiting("dev") == []
            assert ids(locks.holders("dev")) == [1]
    assert locks._locks == {}


async def test_timeout_uses_the_default() -> None:
    locks = ClusterLocks(timeout_s=0.05, notice_after_s=5)
    with anyio.fail_after(2):
        async with locks.hold("dev", EXCLUSIVE, 1, "launch"):
            with pytest.raises(ProtocolError) as info:
                async with locks.hold("dev", EXCLUSIVE, 2, "stop"):
                    pass
    assert info.value.code == ErrorCode.LOCK_TIMEOUT


async def test_preempt_waiting_fails_queued_launch_but_not_holder() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    holder = Client(locks, EXCLUSIVE, 1, "launch", log)
    queued_launch = Client(locks, EXCLUSIVE, 2, "launch", log)
    queued_exec = Client(locks, SHARED, 3, "exec", log)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            for client in (holder, queued_launch, queued_exec):
                tg.start_soon(client.run)
                await wait_all_tasks_blocked()
            down = Holder(9, "down", EXCLUSIVE)
            preempted = locks.preempt_waiting("dev", {"launch"}, by=down)
            assert preempted == [Holder(2, "launch", EXCLUSIVE)]
            await wait_all_tasks_blocked()
            assert queued_launch.error is not None
            assert queued_launch.error.code == ErrorCode.PREEMPTED
            assert queued_launch.error.message == (
                "launch of dev was pre-empted by request 9 (down)"
            )
            # The holder keeps its lock; the exec still waits for it.
            assert ids(locks.holders("dev")) == [1]
            assert ids(locks.waiting("dev")) == [3]
            assert holder.error is None
            holder.release.set()
            await wait_all_tasks_blocked()
            assert log[-1] == "got 3"
            queued_exec.release.set()
    assert log == ["got 1", "error 2", "released 1", "got 3", "released 3"]
    assert locks._locks == {}


async def test_preempt_waiting_on_unknown_cluster_is_a_no_op() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    assert locks.preempt_waiting("nope", {"launch"}, by=Holder(1, "down", EXCLUSIVE)) == []


async def test_downgrade_lets_queued_shared_waiters_in() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    execs = [Client(locks, SHARED, i, "exec", log) for i in (2, 3)]
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            async with locks.hold("dev", EXCLUSIVE, 1, "launch") as grant:
                for client in execs:
                    tg.start_soon(client.run)
                await wait_all_tasks_blocked()
                assert log == []
                grant.downgrade()
                assert grant.holder.mode == SHARED
                await wait_all_tasks_blocked()
                assert sorted(log) == ["got 2", "got 3"]
                assert sorted(ids(locks.holders("dev"))) == [1, 2, 3]
                assert {h.mode for h in locks.holders("dev")} == {SHARED}
            assert sorted(ids(locks.holders("dev"))) == [2, 3]
            for client in execs:
                client.release.set()
    assert locks._locks == {}


async def test_downgrade_keeps_fifo_behind_a_queued_exclusive() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    stop = Client(locks, EXCLUSIVE, 2, "stop", log)
    exec_ = Client(locks, SHARED, 3, "exec", log)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            async with locks.hold("dev", EXCLUSIVE, 1, "launch") as grant:
                tg.start_soon(stop.run)
                await wait_all_tasks_blocked()
                tg.start_soon(exec_.run)
                await wait_all_tasks_blocked()
                grant.downgrade()
                await wait_all_tasks_blocked()
                assert log == []
                assert ids(locks.waiting("dev")) == [2, 3]
            await wait_all_tasks_blocked()
            assert log == ["got 2"]
            stop.release.set()
            exec_.release.set()


async def test_cancelled_waiter_leaves_no_trace() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    with anyio.fail_after(2):
        async with locks.hold("dev", EXCLUSIVE, 1, "launch"):
            async with anyio.create_task_group() as tg:

                async def waiter() -> None:
                    async with locks.hold("dev", EXCLUSIVE, 2, "stop"):
                        pytest.fail("must not be granted")

                tg.start_soon(waiter)
                await wait_all_tasks_blocked()
                assert ids(locks.waiting("dev")) == [2]
                tg.cancel_scope.cancel()
            assert locks.waiting("dev") == []
            assert ids(locks.holders("dev")) == [1]
    assert locks.holders("dev") == []
    assert locks.waiting("dev") == []
    assert locks._locks == {}


async def test_cancelled_waiter_ahead_does_not_block_later_ones() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    later = Client(locks, SHARED, 3, "exec", log)
    with anyio.fail_after(2):
        async with anyio.create_task_group() as outer:
            async with locks.hold("dev", SHARED, 1, "exec"):
                async with anyio.create_task_group() as tg:
                    cancelled = Client(locks, EXCLUSIVE, 2, "stop", log)
                    tg.start_soon(cancelled.run)
                    await wait_all_tasks_blocked()
                    outer.start_soon(later.run)
                    await wait_all_tasks_blocked()
                    assert ids(locks.waiting("dev")) == [2, 3]
                    tg.cancel_scope.cancel()
                # With the stop gone, the exec joins the shared holder.
                await wait_all_tasks_blocked()
                assert log == ["got 3"]
                assert sorted(ids(locks.holders("dev"))) == [1, 3]
            later.release.set()
    assert locks._locks == {}


async def test_body_exception_releases_the_lock() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    with pytest.raises(RuntimeError, match="boom"):
        async with locks.hold("dev", EXCLUSIVE, 1, "launch"):
            raise RuntimeError("boom")
    assert locks._locks == {}
    async with locks.hold("dev", EXCLUSIVE, 2, "launch"):
        assert ids(locks.holders("dev")) == [2]


async def test_call_off_cancels_an_interruptible_holder_after_its_cleanup() -> None:
    """A down calls off a launch that holds the lock: the launch's work is cancelled, its
    clean-up (shielded) still runs and can tell why, it leaves with PREEMPTED naming the
    down, and only then does the down get the lock."""
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    log: list[str] = []
    working = anyio.Event()
    down = Holder(9, "down", EXCLUSIVE)
    outcome: list[ProtocolError] = []

    async def launch() -> None:
        try:
            async with locks.hold("dev", EXCLUSIVE, 1, "launch") as grant:
                with grant.interruptible("launch dev again"):
                    try:
                        working.set()
                        await anyio.sleep(60)  # waiting for SSH, say
                    except anyio.get_cancelled_exc_class():
                        with anyio.CancelScope(shield=True):
                            log.append(f"cleanup, called off by {locks.called_off('dev', 1)}")
                            await anyio.sleep(0.01)
                        raise
                log.append("never here")
        except ProtocolError as exc:
            outcome.append(exc)
            log.append("launch left")

    async def tear_down() -> None:
        async with locks.hold("dev", EXCLUSIVE, 9, "down"):
            log.append("down holds the lock")

    with anyio.fail_after(2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(launch)
            await working.wait()
            assert locks.call_off("dev", {"start"}, by=down) == []  # not its op
            assert locks.call_off("dev", {"launch"}, by=down) == [Holder(1, "launch", EXCLUSIVE)]
            assert locks.call_off("dev", {"launch"}, by=down) == []  # once
            tg.start_soon(tear_down)
    assert log == [f"cleanup, called off by {down}", "launch left", "down holds the lock"]
    assert outcome[0].code == ErrorCode.PREEMPTED
    assert outcome[0].message == "launch of dev was called off by request 9 (down)"
    assert outcome[0].hint == "launch dev again"
    assert locks._locks == {}


async def test_a_holder_called_off_before_its_interruptible_work_meets_it_there() -> None:
    """Granted, but not yet inside its interruptible work (a launch that waited in the queue
    and has not run since): the call-off waits for it there, and cancels it at once."""
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    down = Holder(9, "down", EXCLUSIVE)
    reached: list[str] = []
    with anyio.fail_after(2), pytest.raises(ProtocolError) as info:
        async with locks.hold("dev", EXCLUSIVE, 1, "launch") as grant:
            assert locks.call_off("dev", {"launch"}, by=down) == [Holder(1, "launch", EXCLUSIVE)]
            assert locks.called_off("dev", 1) == down
            with grant.interruptible("again"):
                await anyio.sleep(60)
                reached.append("never")
    assert info.value.code == ErrorCode.PREEMPTED and reached == []
    assert locks._locks == {}
    assert locks.call_off("gone", {"launch"}, by=down) == []


async def test_call_off_leaves_other_ops_alone() -> None:
    locks = ClusterLocks(timeout_s=5, notice_after_s=5)
    async with locks.hold("dev", SHARED, 1, "exec"):
        assert locks.call_off("dev", {"launch"}, by=Holder(9, "down", EXCLUSIVE)) == []
        assert locks.called_off("dev", 1) is None
        assert locks._locks["dev"].interruptible == {}
