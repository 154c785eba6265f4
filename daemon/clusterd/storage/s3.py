"""S3 from the daemon, through aiobotocore: whether a bucket exists and may be used, making
and deleting buckets, and uploading a local directory to one (only what changed, and only
what the workdir sync would send: see local_tree.py).

Clients come from the same session as EC2's (providers/aws/ec2.py: credentials, region and
endpoint found the standard way, AWS_ENDPOINT_URL_S3 included). Every failure is a
StorageError naming the bucket, with a hint where there is one.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.providers.aws.errors import error_code
from clusterd.storage.local_tree import files_to_upload

logger = log.get("clusterd.storage")

# Objects up to this size go in one PUT; larger ones in parts of this size (S3 allows 10,000
# parts, so 16 MiB parts carry objects up to 156 GiB).
PART_BYTES = 16 * 1024 * 1024
UPLOADS_AT_ONCE = 8
DELETE_BATCH = 1000  # DeleteObjects takes at most 1,000 keys
# The file's mtime, kept on each object it uploads: a multipart ETag is no MD5 of the file,
# so size and mtime then say whether it changed.
MTIME_KEY = "clusterd-mtime"
# The tag a bucket clusterd made carries: which daemon's create made it (registry.py).
MARK_TAG = "clusterd-made-by"

ClientFor = Callable[[str], Awaitable[Any]]  # region -> an aiobotocore S3 client


class StorageError(ProtocolError):
    pass


@dataclasses.dataclass(frozen=True)
class RemoteObject:
    key: str
    size: int
    etag: str
    mtime: float | None = None  # ours (MTIME_KEY), when clusterd uploaded it


@dataclasses.dataclass(frozen=True)
class UploadReport:
    uploaded: int
    skipped: int
    bytes_uploaded: int
    # Links not followed (out of the tree, to a directory, dangling): S3 holds no links.
    links_left_out: tuple[str, ...] = ()


# S3 answers a HEAD with a bare 403 both for another account's bucket and for a bucket of
# this account that the credentials have no rights on: the message names both.
REFUSED = ("no permission to {d} bucket {b}: it belongs to another AWS account, or the "
           "credentials clusterd uses lack s3 rights on it",
           "check the bucket's name; the rights clusterd needs are in its AWS policy "
           "(docs/aws-iam-policy.json); `clusterctl check` shows whose credentials it uses")


def storage_error(exc: BaseException, bucket: str, doing: str) -> StorageError:
    """What S3 said, as a StorageError about `bucket` with a hint for the common causes."""
    if isinstance(exc, StorageError):
        return exc
    code = error_code(exc) or type(exc).__name__
    hints = {
        "NoSuchBucket": ("bucket {b} does not exist", "check its name, or give `name:` "
                         "without a source so clusterd makes it"),
        "404": ("bucket {b} does not exist", "check its name, or give `name:` without a "
                "source so clusterd makes it"),
        "AccessDenied": REFUSED,
        "403": REFUSED,
        "AllAccessDisabled": ("no permission to {d} bucket {b}", ""),
        "BucketAlreadyExists": ("bucket name {b} is taken by another AWS account",
                                "bucket names are global: choose another name"),
        "InvalidBucketName": ("{b} is not a valid bucket name", ""),
        "NoCredentialsError": ("no AWS credentials to {d} bucket {b}",
                               "configure them as for the AWS CLI (aws configure), or set "
                               "AWS_PROFILE"),
    }
    text, hint = hints.get(code, (f"{{d}} bucket {{b}} failed: {code}: {exc}", ""))
    return StorageError(ErrorCode.PROVIDER_ERROR, text.format(b=bucket, d=doing), hint)


class S3Buckets:
    def __init__(self, client_for: ClientFor, default_region: Callable[[], Awaitable[str]]
                 ) -> None:
        self._client_for = client_for
        self._default_region = default_region
        self._regions: dict[str, str] = {}

    async def _client(self, region: str | None = None) -> Any:
        return await self._client_for(region or await self._default_region())

    async def region_of(self, bucket: str) -> str | None:
        """The bucket's region, or None if it does not exist; raises if it may not be used."""
        known = self._regions.get(bucket)
        if known is not None:
            return known
        client = await self._client()
        try:
            answer = await client.head_bucket(Bucket=bucket)
        except Exception as exc:
            if error_code(exc) in ("404", "NoSuchBucket", "NotFound"):
                return None
            raise storage_error(exc, bucket, "use") from None
        headers = answer.get("ResponseMetadata", {}).get("HTTPHeaders", {})
        region = headers.get("x-amz-bucket-region") or await self._default_region()
        self._regions[bucket] = region
        return region

    async def create(self, bucket: str, region: str | None = None,
                     mark: str | None = None) -> bool:
        """Make the bucket; True if this call made it, False if this account had it already
        (then it is not ours to delete). Asked first: in us-east-1, S3 answers a create of a
        bucket one owns with 200, as if it had made it. `mark` is put on the bucket it made
        as the tag MARK_TAG, which says later which create made it (`mark_of`)."""
        if await self.region_of(bucket) is not None:
            return False
        region = region or await self._default_region()
        client = await self._client(region)
        params: dict[str, Any] = {"Bucket": bucket}
        if region != "us-east-1":  # S3's one region that takes no location constraint
            params["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            await client.create_bucket(**params)
        except Exception as exc:
            if error_code(exc) == "BucketAlreadyOwnedByYou":
                return False
            raise storage_error(exc, bucket, "create") from None
        self._regions[bucket] = region
        logger.info("bucket created", bucket=bucket, region=region)
        if mark is not None:
            try:
                await client.put_bucket_tagging(
                    Bucket=bucket, Tagging={"TagSet": [{"Key": MARK_TAG, "Value": mark}]})
            except Exception as exc:  # the create stands; only a restart's check needs it
                logger.warning("bucket not tagged", bucket=bucket,
                               error=storage_error(exc, bucket, "tag").message)
        return True

    async def mark_of(self, bucket: str) -> str | None:
        """The bucket's MARK_TAG, or None (no such bucket, no such tag, or not readable)."""
        region = await self.region_of(bucket)
        if region is None:
            return None
        client = await self._client(region)
        try:
            answer = await client.get_bucket_tagging(Bucket=bucket)
        except Exception as exc:
            if error_code(exc) not in ("NoSuchTagSet", "NoSuchTagSetError", "404"):
                raise storage_error(exc, bucket, "read the tags of") from None
            return None
        return next((t["Value"] for t in answer.get("TagSet", []) if t["Key"] == MARK_TAG),
                    None)

    async def objects(self, bucket: str, prefix: str = "") -> list[RemoteObject]:
        """Every object under `prefix` (a directory: 'a/b' lists 'a/b/...')."""
        client = await self._client(await self.region_of(bucket))
        listed: list[RemoteObject] = []
        params: dict[str, Any] = {"Bucket": bucket}
        if prefix:
            params["Prefix"] = prefix.rstrip("/") + "/"
        try:
            paginator = client.get_paginator("list_objects_v2")
            async for page in paginator.paginate(**params):
                listed.extend(RemoteObject(o["Key"], int(o["Size"]), o["ETag"].strip('"'))
                              for o in page.get("Contents", []))
        except Exception as exc:
            raise storage_error(exc, bucket, "list") from None
        return listed

    async def total_size(self, bucket: str) -> tuple[int, int]:
        """(objects, bytes) in the bucket."""
        found = await self.objects(bucket)
        return len(found), sum(o.size for o in found)

    async def delete(self, bucket: str) -> None:
        """Delete the bucket and every object in it (the caller made sure it is ours)."""
        region = await self.region_of(bucket)
        if region is None:
            return
        client = await self._client(region)
        try:
            keys = [o.key for o in await self.objects(bucket)]
            for start in range(0, len(keys), DELETE_BATCH):
                batch = keys[start:start + DELETE_BATCH]
                await client.delete_objects(
                    Bucket=bucket,
                    Delete={"Objects": [{"Key": k} for k in batch], "Quiet": True})
            await client.delete_bucket(Bucket=bucket)
        except Exception as exc:
            if error_code(exc) not in ("404", "NoSuchBucket"):
                raise storage_error(exc, bucket, "delete") from None
        self._regions.pop(bucket, None)
        logger.info("bucket deleted", bucket=bucket)

    async def upload_dir(self, local: str, bucket: str, prefix: str = "") -> UploadReport:
        """Upload the files under `local` to bucket/prefix, skipping those the bucket has
        already (same size, and the same MD5 or the same mtime as uploaded)."""
        client = await self._client(await self.region_of(bucket))
        base = prefix.rstrip("/") + "/" if prefix else ""
        present = {o.key: o for o in await self.objects(bucket, prefix)}
        try:
            tree = await files_to_upload(local)
        except ProtocolError as exc:
            raise StorageError(exc.code, exc.message, exc.hint) from None
        todo: list[tuple[Path, str]] = []
        skipped = 0
        for path, relative in tree.files:
            key = base + relative
            remote = present.get(key)
            if remote is not None and await self._unchanged(client, bucket, path, remote):
                skipped += 1
            else:
                todo.append((path, key))
        sent = 0
        limit = anyio.Semaphore(UPLOADS_AT_ONCE)

        async def one(path: Path, key: str) -> None:
            nonlocal sent
            async with limit:
                size = await self._put(client, bucket, path, key)
            sent += size

        try:
            async with anyio.create_task_group() as group:
                for path, key in todo:
                    group.start_soon(one, path, key)
        except Exception as exc:
            raise storage_error(exc, bucket, "upload to") from None
        logger.info("directory uploaded", bucket=bucket, prefix=prefix, uploaded=len(todo),
                    skipped=skipped, bytes=sent, links_left_out=len(tree.skipped_links))
        return UploadReport(len(todo), skipped, sent, tree.skipped_links)

    async def _unchanged(self, client: Any, bucket: str, path: Path,
                         remote: RemoteObject) -> bool:
        stat = path.stat()
        if stat.st_size != remote.size:
            return False
        if "-" not in remote.etag:  # a single-part upload: its ETag is the MD5
            return await anyio.to_thread.run_sync(_md5, path) == remote.etag
        head = await client.head_object(Bucket=bucket, Key=remote.key)
        mtime = head.get("Metadata", {}).get(MTIME_KEY)
        return mtime is not None and float(mtime) == stat.st_mtime

    async def _put(self, client: Any, bucket: str, path: Path, key: str) -> int:
        stat = path.stat()
        metadata = {MTIME_KEY: repr(stat.st_mtime)}
        if stat.st_size <= PART_BYTES:
            data = await anyio.to_thread.run_sync(path.read_bytes)
            await client.put_object(Bucket=bucket, Key=key, Body=data, Metadata=metadata)
            return len(data)
        upload = await client.create_multipart_upload(Bucket=bucket, Key=key,
                                                      Metadata=metadata)
        upload_id = upload["UploadId"]
        try:
            parts = []
            async with await anyio.open_file(path, "rb") as f:
                number = 1
                while chunk := await f.read(PART_BYTES):
                    done = await client.upload_part(Bucket=bucket, Key=key, PartNumber=number,
                                                    UploadId=upload_id, Body=chunk)
                    parts.append({"PartNumber": number, "ETag": done["ETag"]})
                    number += 1
            await client.complete_multipart_upload(
                Bucket=bucket, Key=key, UploadId=upload_id, MultipartUpload={"Parts": parts})
        except BaseException:
            with anyio.CancelScope(shield=True), anyio.move_on_after(30):
                await client.abort_multipart_upload(Bucket=bucket, Key=key,
                                                    UploadId=upload_id)
            raise
        return stat.st_size


def _md5(path: Path) -> str:
    digest = hashlib.md5(usedforsecurity=False)
    with open(path, "rb") as f:
        while chunk := f.read(1024 * 1024):
            digest.update(chunk)
    return digest.hexdigest()
