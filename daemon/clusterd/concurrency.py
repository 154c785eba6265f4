"""Helpers for structured concurrency: errors out of task groups as users should see them."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

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
