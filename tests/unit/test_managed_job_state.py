"""Managed jobs' records, status transitions and recovery policies (no daemon, no cloud)."""

from __future__ import annotations

import pytest

from clusterctl.protocol import (
    ErrorCode,
    ExitCode,
    ManagedJobStatus,
    ProtocolError,
    exit_code_for_managed_job,
)
from clusterctl.protocol import ManagedJobStatus as S
from clusterd.managed import transitions
from clusterd.managed.recovery import RecoveryPolicy, Strategy, parse_policy, policy_from_yaml
from clusterd.managed.store import (
    ManagedJobStore,
    SubmittedTask,
    cluster_name_for,
    owner_tag,
)
from clusterd.providers.base import BlockScope, Placement
from clusterd.server.managed_handlers import requested_resources
from clusterd.state.db import Database
from clusterd.tasks.loader import load_task

pytestmark = pytest.mark.anyio


def task(**values: object) -> SubmittedTask:
    return SubmittedTask.storable(**{"command": "echo hi", **values})  # type: ignore[arg-type]


# -- records ---------------------------------------------------------------------------------


async def test_a_new_job_is_pending_with_its_cluster_and_task_id_fixed(db: Database) -> None:
    store = ManagedJobStore(db)
    record = await store.insert("Train Big!", task(), "sky-managed")
    assert record.status == S.PENDING
    assert record.cluster == f"mj-{record.id}-train-big"
    assert record.task_id.startswith("sky-managed-") and record.task_id.endswith(record.cluster)
    second = await store.insert("train", task(), "sky-managed")
    assert second.id == record.id + 1 and second.cluster != record.cluster
    again = ManagedJobStore(db)
    await again.load()
    assert again.get(record.id) == record


async def test_an_unfinished_job_holds_its_buckets_and_a_finished_one_does_not(
        db: Database) -> None:
    """What the hourly bucket sweep asks of a bucket user that is no cluster."""
    store = ManagedJobStore(db)
    record = await store.insert("job", task(), "t")
    assert store.holds_buckets(owner_tag(record.id))
    # What a user may name a cluster is never taken for the job.
    assert not store.holds_buckets(f"managed-job-{record.id}")
    await store.set_status(record.id, S.STARTING, "launching a cluster")
    assert store.holds_buckets(owner_tag(record.id))
    await store.set_status(record.id, S.FAILED_NO_RESOURCE, "no capacity")
    assert not store.holds_buckets(owner_tag(record.id))
    for other in (owner_tag(record.id + 1), record.cluster, "managed-job-", "managed-job-x"):
        assert not store.holds_buckets(other), other


async def test_every_status_change_is_an_event_with_its_reason(db: Database) -> None:
    store = ManagedJobStore(db)
    record = await store.insert("job", task(), "t")
    await store.set_status(record.id, S.STARTING, "launching a cluster")
    await store.set_status(record.id, S.RUNNING, "attempt 1 running", agent_job_id=1,
                           attempts=1)
    await store.set_status(record.id, S.RECOVERING, "cluster lost: node i-1 is terminated",
                           recoveries=1, agent_job_id=None)
    await store.add_event(record.id, "launch failed: no capacity; trying again in 10 s")
    await store.set_status(record.id, S.RUNNING, "attempt 2 running", attempts=2)
    done = await store.set_status(record.id, S.SUCCEEDED, "attempt 2 succeeded")
    events = await store.events(record.id)
    assert [(e.from_status, e.to_status) for e in events] == [
        (None, "PENDING"), ("PENDING", "STARTING"), ("STARTING", "RUNNING"),
        ("RUNNING", "RECOVERING"), ("RECOVERING", "RECOVERING"), ("RECOVERING", "RUNNING"),
        ("RUNNING", "SUCCEEDED")]
    assert events[3].reason == "cluster lost: node i-1 is terminated"
    assert done.recoveries == 1 and done.attempts == 2 and done.agent_job_id is None
    assert done.ended_at is not None and done.started_at is not None
    assert done.run_started_at is None and done.run_seconds >= 0
    assert store.active() == [] and store.owner_of(done.cluster) is None
    # `jobs_events` with `after`: only the newer ones, of this job only.
    other = await store.insert("other", task(), "t")
    newer = await store.events(record.id, after=events[4].id)
    assert [e.to_status for e in newer] == ["RUNNING", "SUCCEEDED"]
    assert await store.events(record.id, after=events[-1].id) == []
    assert [e.to_status for e in await store.events(other.id)] == ["PENDING"]


async def test_an_illegal_change_is_refused_and_changes_nothing(db: Database) -> None:
    store = ManagedJobStore(db)
    record = await store.insert("job", task(), "t")
    await store.set_status(record.id, S.CANCELLING, "cancel requested")
    with pytest.raises(transitions.IllegalTransition):
        await store.set_status(record.id, S.RUNNING, "no")
    assert store.get(record.id).status == S.CANCELLING  # type: ignore[union-attr]
    assert store.owner_of(record.cluster) == store.get(record.id)
    await store.set_status(record.id, S.CANCELLED, "cancelled by the user")
    for target in S:
        if target != S.CANCELLED:
            with pytest.raises(transitions.IllegalTransition):
                await store.set_status(record.id, target, "after the end")


def test_final_statuses_have_no_way_out_and_others_can_always_be_cancelled() -> None:
    for status in S:
        if status.is_final:
            assert status not in transitions.ALLOWED
        else:
            assert status == S.CANCELLING or S.CANCELLING in transitions.ALLOWED[status]
            assert any(t.is_final for t in transitions.ALLOWED[status])


def test_exit_codes_of_managed_jobs() -> None:
    assert exit_code_for_managed_job(S.SUCCEEDED) == ExitCode.SUCCEEDED
    assert exit_code_for_managed_job(S.CANCELLED) == ExitCode.CANCELLED
    assert exit_code_for_managed_job(S.FAILED_NO_RESOURCE) == ExitCode.FAILED
    assert exit_code_for_managed_job(S.RECOVERING) == ExitCode.NOT_FINISHED
    assert exit_code_for_managed_job(None) == ExitCode.NOT_FINISHED
    assert {s.value for s in ManagedJobStatus} >= {"FAILED_CONTROLLER", "FAILED_PRECHECKS"}


async def test_the_stored_task_keeps_secret_names_never_values(db: Database) -> None:
    text = ("run: echo $TOKEN\nenvs:\n  A: one\n  GIT_TOKEN: ghp_envsecret\n"
            "secrets:\n  TOKEN: s3cr3t-value\n")
    store = ManagedJobStore(db)
    record = await store.insert("job", task(yaml_text=text, command=None, envs={"B": "two"},
                                            secret_names=("TOKEN",)), "t")
    assert record.task.secret_names == ("TOKEN",)
    rows = await db.fetchall("SELECT task FROM managed_jobs")
    stored = rows[0]["task"]
    assert "s3cr3t-value" not in stored and "ghp_envsecret" not in stored
    assert "TOKEN" in stored and "echo $TOKEN" in stored and '"B":"two"' in stored


def test_cluster_names_are_valid_and_short() -> None:
    assert cluster_name_for(7, "my_job.v2") == "mj-7-my-job-v2"
    assert cluster_name_for(7, "!!!") == "mj-7-job"
    assert len(cluster_name_for(123456, "x" * 200)) <= 40


# -- recovery policies -----------------------------------------------------------------------


def test_recovery_policies_as_skypilot_writes_them() -> None:
    assert policy_from_yaml(None) == RecoveryPolicy(Strategy.FAILOVER, 0)
    assert policy_from_yaml("run: x\n") == RecoveryPolicy()
    assert policy_from_yaml(
        "resources:\n  job_recovery:\n    max_restarts_on_errors: 2\n"
    ) == RecoveryPolicy(Strategy.FAILOVER, 2)
    assert policy_from_yaml("resources:\n  spot_recovery: failover\n") == RecoveryPolicy()
    policy = parse_policy({"strategy": "FAILOVER", "max_restarts_on_errors": 2})
    assert [policy.may_restart(n) for n in range(4)] == [True, True, False, False]
    assert not RecoveryPolicy().may_restart(0)  # without it, a user failure is final


@pytest.mark.parametrize("value", [
    {"strategy": "SOMETIMES"}, {"max_restarts_on_errors": -1}, {"max_restarts_on_errors": True},
    {"max_restarts_on_errors": "2"}, {"retries": 2}, ["FAILOVER"],
])
def test_a_bad_recovery_policy_is_refused_by_name(value: object) -> None:
    with pytest.raises(ProtocolError) as info:
        parse_policy(value, "task.yaml")
    assert info.value.code == ErrorCode.INVALID_TASK
    assert "task.yaml: resources.job_recovery" in info.value.message


def test_each_strategy_steers_a_relaunch_away_from_where_the_job_was_lost() -> None:
    lost = Placement("aws", "us-east-1", "us-east-1b", "m6i.large", 2, 8, spot=True)
    failover = parse_policy("failover").steering(lost)
    assert failover is not None and failover.first_region == ("aws", "us-east-1")
    assert [(p.zone, s) for p, s in failover.avoid] == [("us-east-1b", BlockScope.ZONE)]
    eager = parse_policy({"strategy": "EAGER_NEXT_REGION"}).steering(lost)
    assert eager is not None and eager.first_region is None
    assert [(p.region, s) for p, s in eager.avoid] == [("us-east-1", BlockScope.REGION)]
    # A Kubernetes context has no zones: it stays first, not skipped.
    pods = parse_policy(None).steering(Placement("kubernetes", "ctx", None, None, 1, 1))
    assert pods is not None and pods.avoid == () and pods.first_region == ("kubernetes", "ctx")
    assert RecoveryPolicy().steering(None) is None



async def test_status_marks_the_clusters_of_unfinished_managed_jobs(db: Database) -> None:
    from clusterd.server.managed_handlers import ManagedHandlers

    store = ManagedJobStore(db)
    record = await store.insert("x", task(), "t")
    handlers = ManagedHandlers(None, store, None)  # type: ignore[arg-type]
    views = [{"name": "dev"}, {"name": record.cluster}]
    marked = handlers.mark_owned(views)
    assert marked == [{"name": "dev"}, {"name": record.cluster, "managed_job": record.id}]
    assert views[1] == {"name": record.cluster}  # cached views are never changed
    await store.set_status(record.id, S.CANCELLED, "cancelled")
    assert handlers.mark_owned(views) is views


def test_overrides_reapplied_when_a_job_loads_its_task_again() -> None:
    from clusterd.tasks.loader import load_task
    from clusterd.tasks.overrides import apply_overrides

    task = load_task(yaml_text="resources:\n  any_of:\n    - cpus: 1\n    - cpus: 2\nrun: x\n")
    changed = apply_overrides(task, num_nodes=3, name="n", cpus="4+")
    assert changed.num_nodes == 3 and changed.name == "n"
    assert changed.resources.cpus == 4 and changed.resources.cpus_at_least
    # Both alternatives became the same: one, as in SkyPilot's set of resources.
    assert changed.resource_choices == ()
    assert apply_overrides(task) is task


# -- what `jobs queue` shows as RESOURCES -----------------------------------------------------


@pytest.mark.parametrize(("yaml_text", "shown"), [
    ("run: echo hi\n", "1x[CPU:"),
    ("num_nodes: 2\nresources:\n  cpus: 4\n  use_spot: true\nrun: echo hi\n",
     "2x[CPU:4, spot]"),
    ("resources:\n  instance_type: m6i.large\nrun: echo hi\n", "1x[CPU:"),
])
def test_requested_resources(yaml_text: str, shown: str) -> None:
    task = load_task(yaml_text=yaml_text, source="t.yaml", cwd="/")
    text = requested_resources(task)
    assert text.startswith(shown), text
    if "instance_type" in yaml_text:
        assert text.endswith(", m6i.large]"), text


async def test_the_stored_task_keeps_no_url_credentials_and_says_where_they_were(
        db: Database) -> None:
    text = "run: git clone https://u:TOKEN-yaml@host/r\n"
    store = ManagedJobStore(db)
    record = await store.insert("job", task(
        command="git clone https://TOKEN-cmd@host/r", envs={"REPO": "https://u:TOKEN-env@h/x",
                                                            "A": "1"}), "t")
    from_yaml = await store.insert("job", task(yaml_text=text, command=None), "t")
    plain = await store.insert("job", task(envs={"REPO": "https://h/x"}), "t")
    rows = await db.fetchall("SELECT task FROM managed_jobs")
    assert all("TOKEN" not in row["task"] for row in rows)
    assert record.task.envs == {"REPO": "https://<redacted>@h/x", "A": "1"}
    assert record.task.redacted == ("command", "env REPO")
    assert from_yaml.task.redacted == ("the task YAML",)
    assert plain.task.redacted == () and plain.task.envs == {"REPO": "https://h/x"}
    again = ManagedJobStore(db)
    await again.load()
    assert again.get(record.id) == record
