"""Buckets against a real S3 API (moto's server, over HTTP): the daemon's side (storage/s3.py:
making, uploading only what changed, deleting) and a node's COPY (the `s3-copy` node helper),
run as the node would run it.

Run in a network namespace with only `lo` by test_aws_provider_isolated.py; run directly,
outside one, it skips."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import subprocess
import sys
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import boto3
import pytest
from botocore.exceptions import ClientError

from clusterd.agent import bucket_copy
from clusterd.config import Settings
from clusterd.providers.aws.ec2 import EC2Api
from clusterd.state.db import Database
from clusterd.storage import s3
from clusterd.storage.cluster_mounts import ClusterMounts
from clusterd.storage.node_rclone import NodeRclone
from clusterd.storage.registry import BucketRegistry
from clusterd.storage.s3 import S3Buckets, StorageError, storage_error
from clusterd.storage.service import StorageService
from clusterd.tasks.spec import BucketMount
from tests.integration.moto_server import IN_NETNS, aws_environment, moto_server

MountParams = Callable[[str, str, Path], dict[str, Any]]

pytestmark = [
    pytest.mark.anyio,
    pytest.mark.skipif(not os.environ.get(IN_NETNS),
                       reason="runs in a network namespace of its own, through "
                       "test_aws_provider_isolated.py"),
]


@pytest.fixture(scope="module")
def moto(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    with moto_server(tmp_path_factory.mktemp("moto")) as endpoint:
        yield endpoint


@pytest.fixture
def env(moto: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return aws_environment(tmp_path, moto, ("s3",), monkeypatch)


@pytest.fixture
async def buckets(env: Path) -> AsyncIterator[S3Buckets]:
    api = EC2Api(lambda: 60.0)
    try:
        yield S3Buckets(lambda region: api.client("s3", region), api.default_region)
    finally:
        await api.aclose()


def s3_client(moto: str) -> Any:
    return boto3.client("s3", region_name="us-east-1", endpoint_url=moto,
                        aws_access_key_id="testing", aws_secret_access_key="testing")


def tree(root: Path) -> dict[str, str]:
    """Relative path -> sha256 of every file under root."""
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


async def test_create_is_true_only_for_the_call_that_made_it(buckets: S3Buckets) -> None:
    assert await buckets.region_of("made-here") is None
    assert await buckets.create("made-here") is True
    assert await buckets.region_of("made-here") == "us-east-1"
    assert await buckets.create("made-here") is False  # ours already: not made by this call
    assert await buckets.create("made-west", "us-west-2") is True
    assert await buckets.region_of("made-west") == "us-west-2"


async def test_upload_sends_only_what_changed(buckets: S3Buckets, env: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(s3, "PART_BYTES", 5 * 1024 * 1024)  # S3's smallest part
    local = env / "ds"
    (local / "sub").mkdir(parents=True)
    (local / "a.txt").write_text("alpha\n")
    (local / "sub" / "b.bin").write_bytes(os.urandom(1000))
    (local / "big.bin").write_bytes(os.urandom(11 * 1024 * 1024 + 7))  # three parts
    await buckets.create("up-1")
    first = await buckets.upload_dir(str(local), "up-1", "data/")
    assert (first.uploaded, first.skipped) == (3, 0)
    assert first.bytes_uploaded == 6 + 1000 + 11 * 1024 * 1024 + 7
    keys = {o.key: o for o in await buckets.objects("up-1", "data")}
    assert set(keys) == {"data/a.txt", "data/sub/b.bin", "data/big.bin"}
    assert "-" in keys["data/big.bin"].etag  # multipart: skipped by size and mtime
    again = await buckets.upload_dir(str(local), "up-1", "data")
    assert (again.uploaded, again.skipped) == (0, 3)
    (local / "a.txt").write_text("alpha, changed\n")
    os.utime(local / "big.bin", (1, 1))  # same bytes, another mtime: sent again
    third = await buckets.upload_dir(str(local), "up-1", "data")
    assert (third.uploaded, third.skipped) == (2, 1)


async def test_upload_follows_no_link_out_of_the_tree_and_keeps_skyignore(
        buckets: S3Buckets, env: Path) -> None:
    private = env / "private"
    private.mkdir()
    (private / "credentials").write_text("mine only\n")
    local = env / "ds"
    local.mkdir()
    (local / "a.txt").write_text("alpha\n")
    (local / "secret.env").write_text("TOKEN=x\n")
    (local / ".skyignore").write_text("*.env\n")
    os.symlink(private / "credentials", local / "creds")
    os.symlink(private, local / "home")
    await buckets.create("up-links")
    report = await buckets.upload_dir(str(local), "up-links")
    assert sorted(report.links_left_out) == ["creds", "home"]
    assert {o.key for o in await buckets.objects("up-links")} == {"a.txt", ".skyignore"}


async def test_delete_removes_the_bucket_and_its_objects(buckets: S3Buckets,
                                                         moto: str) -> None:
    await buckets.create("to-go")
    client = s3_client(moto)
    for index in range(1005):  # more than one DeleteObjects batch
        client.put_object(Bucket="to-go", Key=f"k/{index}", Body=b"x")
    assert await buckets.total_size("to-go") == (1005, 1005)
    await buckets.delete("to-go")
    assert await buckets.region_of("to-go") is None
    await buckets.delete("to-go")  # already gone: nothing to do


async def test_listing_a_missing_bucket_says_so_with_a_hint(buckets: S3Buckets) -> None:
    with pytest.raises(StorageError) as caught:
        await buckets.upload_dir("/nonexistent", "no-such-bucket")
    assert "no-such-bucket" in caught.value.message


def node_copy(moto: str, env: Path, **params: Any) -> dict[str, Any]:
    """The node helper as the daemon runs it on a node: JSON on stdin, JSON out."""
    done = subprocess.run(
        [sys.executable, "-m", "clusterd.agent.node", "s3-copy", "-"],
        input=json.dumps({"endpoint_url": moto, "region": "us-east-1",
                          "credentials_file": str(env / "credentials"), **params}),
        capture_output=True, text=True, timeout=300,
        env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    reply: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reply


def test_node_copy_of_a_prefix_is_byte_identical_and_skips_what_it_has(
        moto: str, env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    client = s3_client(moto)
    client.create_bucket(Bucket="src")
    sent: dict[str, bytes] = {f"x/{i:04d}.txt": f"object {i}\n".encode() for i in range(300)}
    sent["x/deep/er/big.bin"] = os.urandom(20 * 1024 * 1024 + 3)  # fetched in ranges
    sent["x/dir/"] = b""  # a directory marker, as the console makes them
    sent["xylophone/not-under"] = b"no"  # shares the characters, not the prefix
    for key, body in sent.items():
        client.put_object(Bucket="src", Key=key, Body=body)
    dest = env / "node" / "data"
    first = node_copy(moto, env, bucket="src", prefix="x", dest=str(dest))
    assert first == {"objects": 301, "bytes": sum(len(b) for b in sent.values()) - 2,
                     "skipped": 0}, first
    want = {k[2:]: hashlib.sha256(b).hexdigest() for k, b in sent.items()
            if k.startswith("x/") and not k.endswith("/")}
    assert tree(dest) == want
    assert not list(dest.rglob(".*clusterd-partial"))
    (dest / "0001.txt").write_text("tampered, other size\n")
    again = node_copy(moto, env, bucket="src", prefix="x/", dest=str(dest))
    assert (again["objects"], again["skipped"]) == (1, 300), again
    assert tree(dest) == want


def test_node_copy_of_one_object_is_a_file(moto: str, env: Path) -> None:
    client = s3_client(moto)
    client.create_bucket(Bucket="one")
    client.put_object(Bucket="one", Key="model/weights.pt", Body=b"w" * 1234)
    dest = env / "weights.pt"
    assert node_copy(moto, env, bucket="one", prefix="model/weights.pt",
                     dest=str(dest))["objects"] == 1
    assert dest.read_bytes() == b"w" * 1234


@pytest.mark.parametrize("key", ["p/../escape", "p/a/../../../x", "p//../../etc/x"])
def test_a_key_climbing_out_of_the_destination_is_refused(key: str, tmp_path: Path) -> None:
    with pytest.raises(bucket_copy.CopyError):
        bucket_copy.target_of(tmp_path, "p/", key)


def test_node_copy_of_a_missing_bucket_is_an_error_naming_it(moto: str, env: Path) -> None:
    reply = node_copy(moto, env, bucket="absent-bucket", prefix="", dest=str(env / "d"))
    assert "s3://absent-bucket" in reply["error"] and "NoSuchBucket" in reply["error"]


def node_helper(command: str, **params: Any) -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-m", "clusterd.agent.node", command, "-"],
                          input=json.dumps(params), capture_output=True, text=True, timeout=300,
                          env={k: v for k, v in os.environ.items() if not k.startswith("AWS_")})
    reply: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return reply


@pytest.fixture(scope="module")
def rclone() -> str:
    """The rclone clusterd sends to nodes (this machine's may be too old to mount): from the
    wheelhouse root `clusterd --prepare-runtime` readies, as a daemon without the package
    index finds it."""
    return str(NodeRclone(Settings.from_env().wheelhouse_dir).build(os.uname().machine))


@pytest.fixture
def mount_params(moto: str, env: Path, rclone: str) -> MountParams:
    def params(bucket: str, mode: str, dest: Path) -> dict[str, Any]:
        return {"bucket": bucket, "prefix": "ckpt", "dest": str(dest), "mode": mode,
                "region": "us-east-1", "endpoint_url": moto, "state": str(env / "mounts"),
                "credentials_file": str(env / "credentials"), "rclone": rclone}

    return params


@pytest.fixture
def mounts(env: Path) -> Iterator[Path]:
    yield env / "mounts"
    node_helper("s3-unmount", state=str(env / "mounts"))


@pytest.mark.parametrize("mode", ["MOUNT", "MOUNT_CACHED"])
def test_a_mount_reads_the_bucket_and_writes_reach_it(moto: str, env: Path, mounts: Path,
                                                      mode: str, mount_params: MountParams
                                                      ) -> None:
    bucket = f"mnt-{mode.lower().replace('_', '-')}"
    client = s3_client(moto)
    client.create_bucket(Bucket=bucket)
    client.put_object(Bucket=bucket, Key="ckpt/step-1.txt", Body=b"one\n")
    dest = env / "ckpt"
    params = mount_params(bucket, mode, dest)
    assert node_helper("s3-mount", **params) == {"dest": str(dest), "already": False}
    assert node_helper("s3-mount", **params)["already"] is True
    assert (dest / "step-1.txt").read_text() == "one\n"
    payload = os.urandom(3 * 1024 * 1024)
    (dest / "step-2.bin").write_bytes(payload)  # written and closed: the job is done with it
    assert node_helper("s3-flush", state=str(mounts), timeout=60).get("error") is None
    got = client.get_object(Bucket=bucket, Key="ckpt/step-2.bin")["Body"].read()
    assert got == payload
    assert node_helper("s3-unmount", state=str(mounts))["unmounted"] == [str(dest)]
    assert not os.path.ismount(dest) and list(dest.iterdir()) == []


def listening_tcp_inodes() -> set[str]:
    """The socket inodes of every TCP socket listening in this network namespace."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == "0A":  # LISTEN
                found.add(fields[9])
    return found


def socket_inodes(pid: int) -> set[str]:
    found = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):
            target = os.readlink(fd)
            if target.startswith("socket:["):
                found.add(target[len("socket:["):-1])
    return found


def test_a_mounts_remote_control_is_private(moto: str, env: Path, mounts: Path,
                                            mount_params: MountParams) -> None:
    client = s3_client(moto)
    client.create_bucket(Bucket="mnt-private")
    dest = env / "private"
    assert "error" not in node_helper("s3-mount", **mount_params("mnt-private", "MOUNT", dest))
    (record,) = json.loads((mounts / "mounts.json").read_text())
    pid = int(record["pid"])
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    for word in (b"pass", b"user", b"secret", b"htpasswd"):
        assert not [a for a in argv if word in a.lower()], argv
    assert not [e for e in environ if e.lower().startswith(b"rclone_rc")], environ
    assert not set(record) & {"rc_user", "rc_pass", "rc_addr"}, record
    # The remote control: a Unix socket in a directory of this user's that nobody else
    # can enter; no TCP port at all.
    rc_socket = Path(record["rc_socket"])
    assert stat.S_ISSOCK(rc_socket.stat().st_mode)
    rc_dir = rc_socket.parent.stat()
    assert (rc_dir.st_uid, stat.S_IMODE(rc_dir.st_mode)) == (os.getuid(), 0o700)
    assert argv[argv.index(b"--rc-addr") + 1] == f"unix://{rc_socket}".encode()
    assert not socket_inodes(pid) & listening_tcp_inodes()
    # And a flush still asks it (writes reach the bucket before the job is done).
    (dest / "out.txt").write_text("written\n")
    assert node_helper("s3-flush", state=str(mounts), timeout=60).get("error") is None
    got = client.get_object(Bucket="mnt-private", Key="ckpt/out.txt")["Body"].read()
    assert got == b"written\n"
    assert node_helper("s3-unmount", state=str(mounts))["unmounted"] == [str(dest)]
    assert not rc_socket.parent.exists()


def test_an_rclone_too_old_for_a_private_mount_is_refused_naming_it(
        moto: str, env: Path, mounts: Path, mount_params: MountParams) -> None:
    old = env / "bin" / "rclone"
    old.parent.mkdir()
    old.write_text("#!/bin/sh\necho 'rclone v1.60.1-DEV'\n")
    old.chmod(0o755)
    params = {**mount_params("mnt-old", "MOUNT", env / "old"), "rclone": str(old)}
    reply = subprocess.run(
        [sys.executable, "-m", "clusterd.agent.node", "s3-mount", "-"],
        input=json.dumps(params), capture_output=True, text=True, timeout=120,
        env={**os.environ, "PATH": f"{old.parent}:/usr/bin:/bin"})
    error = json.loads(reply.stdout.strip().splitlines()[-1])["error"]
    assert "this node has rclone 1.60" in error and "rclone 1.63 or later" in error, error


def test_a_mount_on_a_non_empty_directory_is_refused(moto: str, env: Path, mounts: Path,
                                                     mount_params: MountParams) -> None:
    s3_client(moto).create_bucket(Bucket="mnt-full")
    dest = env / "full"
    dest.mkdir()
    (dest / "x").write_text("x")
    reply = node_helper("s3-mount", **mount_params("mnt-full", "MOUNT", dest))
    assert "is not empty" in reply["error"]


async def test_only_buckets_clusterd_made_are_listed_and_released(buckets: S3Buckets,
                                                                  env: Path) -> None:
    db = Database(env / "state.db")
    await db.open()
    try:
        said: list[str] = []

        async def progress(text: str) -> None:
            said.append(text)

        service = storage_on(buckets, db)
        assert await buckets.create("was-there") is True  # the user's, not clusterd's
        temporary = BucketMount("/a", "tmp-made", mode="COPY", create=True, persistent=False)
        kept = BucketMount("/b", "kept-made", mode="COPY", create=True)
        theirs = BucketMount("/c", "was-there", mode="COPY", create=True, persistent=False)
        await service.prepare("c1", (temporary, kept, theirs), progress)
        assert said == ["creating bucket tmp-made in us-east-1",
                        "creating bucket kept-made in us-east-1"]
        await service.prepare("c2", (temporary,), progress)
        listed = {record.name: record for record, _, _ in await service.listing()}
        assert set(listed) == {"tmp-made", "kept-made"}
        assert listed["tmp-made"].clusters == ("c1", "c2")
        assert await service.release("c1") == []
        assert await buckets.region_of("tmp-made") is not None  # c2 still uses it
        with pytest.raises(StorageError, match="used by c2"):
            await service.delete("tmp-made")
        with pytest.raises(StorageError, match="not made by clusterd"):
            await service.delete("was-there")
        assert await service.sweep(lambda name: False) == []  # c2 is gone: released
        assert await buckets.region_of("tmp-made") is None
        assert await buckets.region_of("kept-made") is not None
        assert await buckets.region_of("was-there") is not None
        assert [r.name for r, _, _ in await service.listing()] == ["kept-made"]
        await service.delete("kept-made")
        assert await buckets.region_of("kept-made") is None
    finally:
        await db.close()


async def buckets_region() -> str:
    return "us-east-1"


def storage_on(buckets: S3Buckets, db: Database, daemon: str = "clusterd-test") -> StorageService:
    """The daemon's side only: no node is reached."""
    return StorageService(buckets, BucketRegistry(db), runner_for=None,  # type: ignore[arg-type]
                          credentials=None, default_region=buckets_region,  # type: ignore[arg-type]
                          daemon=daemon, node_rclone=NodeRclone(Path("/nonexistent")),
                          cluster_mounts=ClusterMounts(db))


@pytest.fixture
async def db(env: Path) -> AsyncIterator[Database]:
    database = Database(env / "state.db")
    await database.open()
    try:
        yield database
    finally:
        await database.close()


async def quiet(text: str) -> None:
    pass


async def refused_create(bucket: str, region: str | None = None,
                         mark: str | None = None) -> bool:
    raise storage_error(ClientError({"Error": {"Code": "AccessDenied"}}, "CreateBucket"),
                        bucket, "create")


@pytest.mark.parametrize("failure", ["refused", "cancelled"])
async def test_a_bucket_whose_create_failed_is_never_clusterds(
        buckets: S3Buckets, db: Database, moto: str, monkeypatch: pytest.MonkeyPatch,
        failure: str) -> None:
    service = storage_on(buckets, db)
    name = f"not-made-{failure}"
    to_make = BucketMount("/a", name, mode="COPY", create=True, persistent=False)
    if failure == "refused":
        monkeypatch.setattr(buckets, "create", refused_create)
        with pytest.raises(StorageError, match=f"no permission to create bucket {name}"):
            await service.prepare("c1", (to_make,), quiet)
    else:
        creating = anyio.Event()

        async def hangs(bucket: str, region: str | None = None,
                        mark: str | None = None) -> bool:
            creating.set()
            await anyio.sleep_forever()
            return True

        monkeypatch.setattr(buckets, "create", hangs)
        async with anyio.create_task_group() as group:
            group.start_soon(service.prepare, "c1", (to_make,), quiet)
            with anyio.fail_after(10):
                await creating.wait()
            group.cancel_scope.cancel()
    monkeypatch.undo()
    s3_client(moto).create_bucket(Bucket=name)  # someone else takes the name
    assert await service.listing() == []
    with pytest.raises(StorageError, match="not made by clusterd"):
        await service.delete(name)
    await service.prepare("c2", (BucketMount("/b", name, mode="COPY"),), quiet)
    assert await service.release("c2") == []
    assert await service.release("c1") == []
    assert await service.sweep(lambda cluster: False) == []
    assert await buckets.region_of(name) == "us-east-1"  # still there, untouched


async def test_creates_cut_off_by_a_restart_are_settled_without_deleting(
        buckets: S3Buckets, db: Database, moto: str) -> None:
    registry = BucketRegistry(db)
    before = storage_on(buckets, db)
    # A daemon killed after its create, before recording it made: the bucket has its mark.
    made_at = await registry.making("cut-ours", "us-east-1", False, "c1")
    assert await buckets.create("cut-ours", "us-east-1", before._mark(made_at)) is True
    # Killed before its create; someone else made the name since, or another daemon did.
    await registry.making("cut-theirs", "us-east-1", False, "c1")
    s3_client(moto).create_bucket(Bucket="cut-theirs")
    other_at = await registry.making("cut-other", "us-east-1", False, "c1")
    other = storage_on(buckets, db, daemon="clusterd-other")
    assert await buckets.create("cut-other", "us-east-1", other._mark(other_at)) is True
    await registry.making("cut-absent", "us-east-1", False, "c1")
    assert await before.listing() == []  # being made: not (yet) clusterd's
    restarted = storage_on(buckets, db)
    await restarted.settle_unfinished(started_at=time.time())
    assert [(r.name, r.clusters) for r, _, _ in await restarted.listing()] == [
        ("cut-ours", ("c1",))]
    assert await registry.unfinished() == []
    for name in ("cut-ours", "cut-theirs", "cut-other"):
        assert await buckets.region_of(name) == "us-east-1"
    # A create this daemon began after it started is left alone.
    await registry.making("cut-now", "us-east-1", False, "c1")
    await restarted.settle_unfinished(started_at=time.time() - 60)
    assert [r.name for r in await registry.unfinished()] == ["cut-now"]


def test_a_flush_whose_uploads_keep_failing_says_so(moto: str, env: Path, mounts: Path,
                                                    mount_params: MountParams) -> None:
    client = s3_client(moto)
    client.create_bucket(Bucket="mnt-lost")
    dest = env / "lost"
    assert "error" not in node_helper("s3-mount", **mount_params("mnt-lost", "MOUNT_CACHED",
                                                                 dest))
    client.delete_bucket(Bucket="mnt-lost")  # gone under the mount: uploads fail
    (dest / "late.txt").write_text("never uploaded\n")
    reply = node_helper("s3-flush", state=str(mounts), timeout=120, stalled_grace=5)
    assert "1 file(s) could not be uploaded to mnt-lost/ckpt: " in reply["error"], reply
    assert "NoSuchBucket" in reply["error"]
    # Unmounting gives up on it too (bounded), rather than hang the teardown.
    assert node_helper("s3-unmount", state=str(mounts), stalled_grace=3)["unmounted"] == [
        str(dest)]
