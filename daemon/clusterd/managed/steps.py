"""A managed job's decisions, as pure functions of its record and what exists (the
controller engine's `step`): which action comes next, and what an attempt's end means.
The controller (controller.py) does the actions; these only choose them."""

from __future__ import annotations

import dataclasses

from clusterctl.protocol import ClusterStatus, JobStatus
from clusterctl.protocol import ManagedJobStatus as S
from clusterd.control import Action
from clusterd.managed.recovery import RecoveryPolicy
from clusterd.managed.store import ManagedJobRecord, owner_tag
from clusterd.state.clusters import ClusterRecord

USER_FAILURES = {JobStatus.FAILED: S.FAILED, JobStatus.FAILED_SETUP: S.FAILED_SETUP}


@dataclasses.dataclass(frozen=True)
class Finish(Action):
    """End the job with `status`: recorded as `ending`, its cluster torn down, then set."""

    status: S
    reason: str


@dataclasses.dataclass(frozen=True)
class Launch(Action):
    """A cluster for the job, UP (what is left of an earlier one torn down first)."""


@dataclasses.dataclass(frozen=True)
class Submit(Action):
    """The next attempt, submitted to the job's UP cluster."""


@dataclasses.dataclass(frozen=True)
class Watch(Action):
    """Follow the running attempt until it ends or its cluster is lost."""

    lasting = True


@dataclasses.dataclass(frozen=True)
class Recover(Action):
    """The cluster is lost: torn down, so that the next step relaunches it."""

    why: str


@dataclasses.dataclass(frozen=True)
class Restart(Action):
    """A user failure retried under max_restarts_on_errors: RECOVERING, no attempt running."""

    restarts: int  # user restarts so far, this one included
    reason: str


def next_action(record: ManagedJobRecord, cluster: ClusterRecord | None) -> Action | None:
    """What the job's driver does next, given its record and its cluster's (None: no record
    of that name). None: stop driving (final, or being cancelled: the cancel ends it)."""
    if record.status.is_final:
        return None
    if record.ending is not None:
        status, _, reason = record.ending.partition(" ")
        return Finish(S(status), reason)
    if record.status == S.CANCELLING:
        return None
    if cluster is not None and cluster.owner != owner_tag(record.id):
        # Made by the user under the job's name after the job was recorded (a race with
        # `launch`): never reused, cancelled or torn down by the job.
        return Finish(S.FAILED_PRECHECKS,
                      f"cluster {record.cluster} was made by someone else, not this job: it "
                      "is left alone; submit the job again for a new name")
    up = cluster is not None and cluster.status == ClusterStatus.UP
    if record.agent_job_id is not None:  # an attempt runs
        if cluster is not None and cluster.status in (ClusterStatus.UP, ClusterStatus.INIT):
            # A refresh that found the agent slow once (a daemon just started, a loaded
            # machine) made the cluster INIT: the watch's own checks say whether it is lost,
            # as they do for a cluster that is UP.
            return Watch()
        return Recover("its cluster was found gone" if cluster is None
                       else f"its cluster is {cluster.status}")
    return Submit() if up else Launch()


def after_attempt(record: ManagedJobRecord, status: JobStatus, reason: str,
                  lost: str | None, policy: RecoveryPolicy) -> Action:
    """What an attempt's end on the agent means: `status` and its failure `reason`, `lost`
    why the cluster counts as lost now (None: it is fine)."""
    if status == JobStatus.SUCCEEDED:
        return Finish(S.SUCCEEDED, f"attempt {record.attempts} succeeded")
    if status == JobStatus.CANCELLED:
        return Finish(S.CANCELLED, "its job was cancelled on the cluster")
    if status not in USER_FAILURES:
        # FAILED_DRIVER: the agent or Ray failed under the job, not the user's code.
        return Recover(f"attempt {record.attempts} {status}: {reason}")
    if lost is not None:
        # A node lost under a running job fails its ranks (Ray's NodeDiedError) and can end
        # the attempt before a health check sees the loss: a lost cluster is a recovery,
        # not the user's failure.
        return Recover(f"attempt {record.attempts} {status} ({reason}) and {lost}")
    text = f"attempt {record.attempts} {status}" + (f": {reason}" if reason else "")
    if policy.may_restart(record.user_restarts):
        restarts = record.user_restarts + 1
        return Restart(restarts, f"{text}; restart {restarts} of "
                                 f"{policy.max_restarts_on_errors} (max_restarts_on_errors)")
    return Finish(USER_FAILURES[status], text)
