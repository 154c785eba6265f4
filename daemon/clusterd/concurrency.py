"""Helpers for structured concurrency: errors out of task groups as users should see them,
and background loops that outlive a failing step."""

from __future__ import annotations

import contextlib
from collections.abc import Awaitable, Callable, Coroutine, Iterable, Iterator
from typing import Any, TypeVar

import anyio
import structlog

from clusterctl.protocol import ProtocolError


def _leaves(group: BaseExceptionGroup[BaseException]) -> Iterator[BaseException]:
    for exc in group.exceptions:
        if isinstance(exc, BaseExceptionGroup):
            yield from _leaves(exc)
        else:
            yield exc


@contextlib.contextmanager
def first_error() -> Iterator[None]:
    """Raise a task group's first clear error (a ProtocolError) instead of the group.

    Parallel work on several nodes fails with one error per node; the user needs the reason,
    not "unhandled errors in a TaskGroup". Groups without a ProtocolError pass unchanged.
    """
    try:
        yield
    except BaseExceptionGroup as group:
        for leaf in _leaves(group):
            if isinstance(leaf, ProtocolError):
                raise leaf from group
        raise


T = TypeVar("T")


async def on_each(items: Iterable[T], step: Callable[[T], Coroutine[Any, Any, None]]) -> None:
    """`step` on every item at once (nodes, mostly); the first clear error is raised (see
    first_error) and the other steps are cancelled."""
    with first_error():
        async with anyio.create_task_group() as group:
            for item in items:
                group.start_soon(step, item)


async def survive(what: str, step: Callable[[], Awaitable[None]]) -> bool:
    """Run one step of a background loop; an error in it is logged, not fatal.

    The loops (refresh, orphan scans, autostop, retention) run beside every client: one of
    them failing on something passing (out of file descriptors, a full disk, a provider's
    library misbehaving) must cost that step, not the daemon. Cancellation still ends them.
    Returns whether the step succeeded.
    """
    try:
        await step()
    except Exception as exc:  # the loop's next period is the retry
        structlog.get_logger("clusterd").error(
            "a background step failed; trying again next period", step=what,
            error=f"{type(exc).__name__}: {exc}"[:500], exc_info=exc)
        return False
    return True
