"""A managed job's decisions (clusterd.managed.steps): pure functions of its record and its
cluster's, checked with made-up records and no daemon."""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import pytest

from clusterctl.protocol import ClusterStatus, JobStatus
from clusterctl.protocol import ManagedJobStatus as S
from clusterd.managed.recovery import RecoveryPolicy
from clusterd.managed.steps import (
    Finish,
    Launch,
    Recover,
    Restart,
    Submit,
    Watch,
    after_attempt,
    next_action,
)
from clusterd.managed.store import ManagedJobRecord, SubmittedTask, owner_tag
from clusterd.state.clusters import ClusterRecord
from clusterd.tasks.spec import ResourceRequest


def job(status: S = S.PENDING, **fields: Any) -> ManagedJobRecord:
    now = time.time()
    return dataclasses.replace(
        ManagedJobRecord(id=7, name="train", task=SubmittedTask(command="x"), status=status,
                         cluster="mj-7-train", task_id="t", submitted_at=now,
                         status_updated_at=now), **fields)


def cluster(status: ClusterStatus = ClusterStatus.UP, owner: str | None = owner_tag(7)
            ) -> ClusterRecord:
    now = time.time()
    return ClusterRecord(name="mj-7-train", provider="local", cloud_name="c", status=status,
                         num_nodes=1, requested_resources=ResourceRequest(), config_hash="h",
                         created_at=now, status_updated_at=now, owner=owner)


@pytest.mark.parametrize("status", [s for s in S if s.is_final])
def test_a_final_job_is_left_alone(status: S) -> None:
    assert next_action(job(status), cluster()) is None


def test_a_recorded_ending_is_finished_first_whatever_exists() -> None:
    record = job(S.RUNNING, ending="FAILED attempt 1 failed: exit 3", agent_job_id=1)
    assert next_action(record, cluster()) == Finish(S.FAILED, "attempt 1 failed: exit 3")
    assert next_action(record, None) == Finish(S.FAILED, "attempt 1 failed: exit 3")


def test_a_job_being_cancelled_stops_its_steps() -> None:
    assert next_action(job(S.CANCELLING), cluster()) is None


@pytest.mark.parametrize("owner", [None, owner_tag(8)])
def test_a_cluster_the_job_did_not_make_ends_it_untouched(owner: str | None) -> None:
    action = next_action(job(S.STARTING), cluster(owner=owner))
    assert isinstance(action, Finish) and action.status == S.FAILED_PRECHECKS
    assert "left alone" in action.reason


@pytest.mark.parametrize("found", [None, cluster(ClusterStatus.INIT),
                                   cluster(ClusterStatus.STOPPED)])
def test_with_no_attempt_running_and_no_up_cluster_it_launches(
        found: ClusterRecord | None) -> None:
    assert next_action(job(S.PENDING), found) == Launch()
    assert next_action(job(S.RECOVERING), found) == Launch()


def test_with_an_up_cluster_and_no_attempt_it_submits() -> None:
    assert next_action(job(S.STARTING), cluster()) == Submit()


@pytest.mark.parametrize("status", [ClusterStatus.UP, ClusterStatus.INIT])
def test_a_running_attempt_on_a_live_cluster_is_watched(status: ClusterStatus) -> None:
    action = next_action(job(S.RUNNING, agent_job_id=3), cluster(status))
    assert action == Watch() and action is not None and action.lasting


def test_a_running_attempt_whose_cluster_is_gone_or_stopped_recovers() -> None:
    assert next_action(job(S.RUNNING, agent_job_id=3), None) == Recover(
        "its cluster was found gone")
    assert next_action(job(S.RUNNING, agent_job_id=3), cluster(ClusterStatus.STOPPED)) == (
        Recover("its cluster is STOPPED"))


def test_an_attempt_that_succeeded_or_was_cancelled_ends_the_job() -> None:
    record = job(S.RUNNING, attempts=2)
    assert after_attempt(record, JobStatus.SUCCEEDED, "", None, RecoveryPolicy()) == Finish(
        S.SUCCEEDED, "attempt 2 succeeded")
    ended = after_attempt(record, JobStatus.CANCELLED, "", None, RecoveryPolicy())
    assert isinstance(ended, Finish) and ended.status == S.CANCELLED


def test_a_driver_failure_is_a_recovery_not_the_users() -> None:
    action = after_attempt(job(S.RUNNING, attempts=1), JobStatus.FAILED_DRIVER, "ray died",
                           None, RecoveryPolicy())
    assert action == Recover("attempt 1 FAILED_DRIVER: ray died")


def test_a_user_failure_on_a_lost_cluster_is_a_recovery() -> None:
    action = after_attempt(job(S.RUNNING, attempts=1), JobStatus.FAILED, "NodeDiedError",
                           "node 10.0.0.2 stopped answering", RecoveryPolicy())
    assert isinstance(action, Recover) and "NodeDiedError" in action.why


def test_a_user_failure_is_restarted_while_the_policy_allows_then_ends_the_job() -> None:
    policy = RecoveryPolicy(max_restarts_on_errors=2)
    first = after_attempt(job(S.RUNNING, attempts=1), JobStatus.FAILED, "exit 1", None,
                          policy)
    assert first == Restart(1, "attempt 1 FAILED: exit 1; restart 1 of 2 "
                               "(max_restarts_on_errors)")
    last = after_attempt(job(S.RUNNING, attempts=3, user_restarts=2), JobStatus.FAILED_SETUP,
                         "", None, policy)
    assert last == Finish(S.FAILED_SETUP, "attempt 3 FAILED_SETUP")
