"""Which status changes a managed job may make (SkyPilot's statuses and meanings).

Checked on every change, so a bug in the controller shows as an error at the faulty step, not
as a job that went from CANCELLED back to RUNNING.
"""

from __future__ import annotations

from clusterctl.protocol import ManagedJobStatus as S

# A job's run can end (well or badly) before the controller sees it RUNNING, so STARTING and
# RECOVERING may go straight to a final status. A user failure retried under
# `max_restarts_on_errors` goes RUNNING -> RECOVERING, as in SkyPilot.
_ENDINGS = frozenset({S.SUCCEEDED, S.FAILED, S.FAILED_SETUP, S.FAILED_CONTROLLER})
ALLOWED: dict[S, frozenset[S]] = {
    S.PENDING: frozenset({S.STARTING, S.CANCELLING, S.CANCELLED, S.FAILED_PRECHECKS,
                          S.FAILED_CONTROLLER}),
    S.STARTING: frozenset({S.RUNNING, S.RECOVERING, S.CANCELLING, S.FAILED_NO_RESOURCE,
                           S.FAILED_PRECHECKS} | _ENDINGS),
    S.RUNNING: frozenset({S.RECOVERING, S.CANCELLING} | _ENDINGS),
    S.RECOVERING: frozenset({S.RUNNING, S.CANCELLING} | _ENDINGS),
    S.CANCELLING: frozenset({S.CANCELLED, S.FAILED_CONTROLLER}),
}


class IllegalTransition(ValueError):
    pass


def check(current: S, target: S) -> None:
    """IllegalTransition unless a job in `current` may move to `target` (staying is fine)."""
    if current == target:
        return
    if target not in ALLOWED.get(current, frozenset()):
        raise IllegalTransition(f"a managed job cannot go from {current} to {target}")
