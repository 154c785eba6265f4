"""A managed job acts only on what it made: its cluster's record says so (`owner`), its name
never lands on a user's cluster, and a bucket hold of a job cannot be spelled as a cluster
name. Migration 5 marks as a job's only what the records vouch for."""

from __future__ import annotations

import sqlite3
import time
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterctl.protocol import ManagedJobStatus as S
from clusterd.agent.in_memory import split
from clusterd.managed.controller import ManagedJobController
from clusterd.managed.store import ManagedJobStore, SubmittedTask, owner_tag
from clusterd.provision.plan import refuse_other_owner
from clusterd.requests import RequestManager
from clusterd.services.common import check_name
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.db import MIGRATIONS, Database
from clusterd.state.requests import RequestStore
from clusterd.tasks.spec import ResourceRequest

pytestmark = pytest.mark.anyio


def cluster(name: str, owner: str | None) -> ClusterRecord:
    now = time.time()
    return ClusterRecord(name=name, provider="local", cloud_name=f"{name}-abc",
                         status=ClusterStatus.UP, num_nodes=1,
                         requested_resources=ResourceRequest(),
                         config_hash="h", created_at=now, status_updated_at=now, owner=owner)


async def test_a_job_never_gets_the_name_of_an_existing_cluster(db: Database) -> None:
    clusters = ClusterStore(db)
    await clusters.insert(cluster("mj-1-train", None), "the user's", None)
    store = ManagedJobStore(db)
    record = await store.insert("train", SubmittedTask(command="x"), "t",
                                taken=lambda n: clusters.get(n) is not None)
    assert record.cluster == "mj-1-train-2"
    check_name(record.cluster)
    assert record.task_id.endswith("_mj-1-train-2")


async def test_the_cluster_owner_is_stored() -> None:
    mine = cluster("a", owner_tag(3))
    assert ClusterRecord.from_row(mine.to_row()) == mine
    with pytest.raises(ProtocolError):  # a job tag is never a cluster name
        check_name(owner_tag(3))


def test_a_launch_uses_only_a_cluster_of_its_own_owner() -> None:
    refuse_other_owner(None, owner_tag(1))
    refuse_other_owner(cluster("dev", None), None)
    refuse_other_owner(cluster("mj-1-x", owner_tag(1)), owner_tag(1))
    for record, owner, said in (
            (cluster("mj-1-x", None), owner_tag(1), "managed-job:1 did not make it"),
            (cluster("mj-1-x", owner_tag(1)), None, "was made by managed-job:1"),
            (cluster("mj-1-x", owner_tag(1)), owner_tag(2), "was made by managed-job:1")):
        with pytest.raises(ProtocolError) as info:
            refuse_other_owner(record, owner)
        assert info.value.code == ErrorCode.MANAGED_CLUSTER
        assert said in info.value.message and info.value.hint


async def test_migration_5_marks_only_what_the_records_vouch_for(tmp_path: Path) -> None:
    path = tmp_path / "state.db"
    with sqlite3.connect(path) as conn:
        for script in MIGRATIONS[:4]:
            conn.executescript(script)
        conn.execute("PRAGMA user_version = 4")
        conn.executemany(
            "INSERT INTO requests (id, op, cluster, args, status, created_at) "
            "VALUES (?, 'launch', ?, ?, 'SUCCEEDED', 0)",
            [(10, "mj-1-a", '{"by":"managed job","cluster":"mj-1-a"}'),
             (11, "mj-2-b", '{"cluster":"mj-2-b"}'),  # the user's, adopted before the fix
             (12, "mj-3-c", '{"by":"managed job","cluster":"mj-3-c"}')])
        columns = ("name, provider, cloud_name, status, num_nodes, requested_resources, "
                   "config_hash, created_at, status_updated_at, launch_request_id")
        conn.executemany(
            f"INSERT INTO clusters ({columns}) VALUES (?, 'local', ?, 'UP', 1, '{{}}', 'h', 0, "
            "0, ?)", [("mj-1-a", "a", 10), ("mj-2-b", "b", 11), ("mj-3-c", "c", 12),
                      ("dev", "d", None), ("managed-job-2", "e", None)])
        conn.executemany(
            "INSERT INTO managed_jobs (id, name, task, status, cluster, task_id, submitted_at,"
            " status_updated_at) VALUES (?, 'n', '{}', ?, ?, 't', 0, 0)",
            [(1, "RUNNING", "mj-1-a"), (2, "RUNNING", "mj-2-b"), (3, "SUCCEEDED", "mj-3-c")])
        conn.execute("INSERT INTO buckets VALUES ('bk', 'r', 'made', 0, 'x', 0)")
        conn.executemany("INSERT INTO bucket_users VALUES ('bk', ?)",
                         [("managed-job-1",), ("managed-job-2",), ("managed-job-9",),
                          ("managed-job-1x",), ("dev",)])
    db = Database(path)
    await db.open()
    try:
        owners = dict(await db.fetchall("SELECT name, owner FROM clusters"))
        users = {row[0] for row in await db.fetchall("SELECT cluster FROM bucket_users")}
    finally:
        await db.close()
    assert owners == {"mj-1-a": "managed-job:1", "mj-2-b": None, "mj-3-c": None, "dev": None,
                      "managed-job-2": None}
    # managed-job-2 is a cluster of the user's; job 9 does not exist; 1x is no job's.
    assert users == {"managed-job:1", "managed-job-2", "managed-job-9", "managed-job-1x", "dev"}


def test_the_agent_stores_no_url_credentials_and_runs_with_them() -> None:
    spec = {"name": "j", "setup": "git clone https://u:TOKEN@h/r", "run": "echo hi",
            "envs": {"REPO": "https://TOKEN@h/r", "A": "1"}}
    stored, kept = split(spec, {"K": "secret-value"})
    assert "TOKEN" not in repr(stored) and "secret-value" not in repr(stored)
    assert stored["envs"] == {"REPO": "https://<redacted>@h/r", "A": "1"}
    assert kept.spec(stored) == {**spec, "envs": stored["envs"]}
    assert kept.envs(stored["envs"]) == {**spec["envs"], "K": "secret-value"}
    plain, nothing = split({"run": "echo hi", "envs": {"A": "1"}}, {})
    assert not nothing and plain == {"run": "echo hi", "envs": {"A": "1"}}


class Untouchable:
    """The cluster and job services, for a job whose cluster name someone else took: any
    call that would act on a cluster fails the test; releasing the job's buckets is fine."""

    def __init__(self) -> None:
        self.released: list[str] = []

    async def release_buckets(self, request: object, name: str) -> dict[str, object]:
        self.released.append(name)
        return {"released": name, "problems": []}

    def __getattr__(self, name: str) -> object:
        raise AssertionError(f"the job acted on a cluster it did not make: {name}")


@pytest.mark.parametrize(("status", "ended_as"), [(S.PENDING, S.FAILED_PRECHECKS),
                                                   (S.RECOVERING, S.FAILED_CONTROLLER)])
async def test_a_cluster_of_the_jobs_name_made_by_someone_else_is_never_touched(
        db: Database, tmp_path: Path, status: S, ended_as: S) -> None:
    """The user's launch of the name won a race with the job's (or a database from before
    owners were recorded could not vouch for it): the job ends, the cluster is left alone."""
    clusters, jobs = ClusterStore(db), ManagedJobStore(db)
    record = await jobs.insert("race", SubmittedTask(command="echo hi"), "t")
    if status == S.RECOVERING:
        await jobs.set_status(record.id, S.STARTING, "launching")
        await jobs.set_status(record.id, S.RUNNING, "running", agent_job_id=1)
        await jobs.set_status(record.id, S.RECOVERING, "lost", agent_job_id=None)
    users = cluster(record.cluster, None)
    await clusters.insert(users, "the user's launch", None)
    services = Untouchable()
    requests = RequestManager(RequestStore(db))
    async with anyio.create_task_group() as group:
        requests.attach(group)
        controller = ManagedJobController(
            jobs, clusters, services, services, None, None, requests,  # type: ignore[arg-type]
            tmp_path / "logs")
        await group.start(controller.run)
        with anyio.fail_after(10):
            while not controller.require(record.id).status.is_final:
                await anyio.sleep(0.01)
        group.cancel_scope.cancel()
    ended = controller.require(record.id)
    assert ended.status == ended_as, ended
    assert "left alone" in ended.status_reason
    assert clusters.get(record.cluster) == users
    assert services.released == [owner_tag(record.id)]
