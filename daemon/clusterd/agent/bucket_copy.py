"""COPY of a bucket's prefix onto this node (node helper `s3-copy`), with botocore from the
runtime's venv: objects listed, then fetched by a pool of threads, large ones in ranges at once.

Credentials come the standard way for where the node is: an instance profile through the
instance-metadata endpoint on EC2, or a credentials file the daemon wrote for this cluster
(`credentials_file`; then instance metadata is never asked). A file is written under a
temporary name and renamed, with the object's LastModified as its mtime, so a copy cut short
leaves no half file under the real name, and the next copy skips what is already whole.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import os
import threading
import time
from pathlib import Path, PurePosixPath
from typing import Any

from clusterd.agent.helper_error import HelperError
from clusterd.node_shared.node_commands import BucketCopyReply, BucketCopyRequest, BucketObjects

THREADS = 16
RANGE_BYTES = 8 * 1024 * 1024  # objects larger than this are fetched in ranges at once
READ_BYTES = 1024 * 1024
CREDENTIALS_WAIT_S = 60.0


class CopyError(HelperError):
    pass


def wait_for_credentials(timeout_s: float = CREDENTIALS_WAIT_S) -> None:
    """The node's credentials (no credentials file was sent) come from its instance profile,
    which EC2 may serve only some seconds after it was associated: wait for them (bounded)."""
    import botocore.session

    deadline = time.monotonic() + timeout_s
    while botocore.session.get_session().get_credentials() is None:
        if time.monotonic() > deadline:
            raise CopyError(f"this node has no AWS credentials after {timeout_s:.0f}s (no "
                            "instance profile's on its metadata service)")
        time.sleep(1.0)


def _client(where: BucketObjects) -> Any:
    import botocore.session
    from botocore.config import Config

    if where.credentials_file:
        os.environ["AWS_SHARED_CREDENTIALS_FILE"] = str(
            Path(where.credentials_file).expanduser())
        os.environ["AWS_EC2_METADATA_DISABLED"] = "true"
    else:
        wait_for_credentials()
    session = botocore.session.get_session()
    return session.create_client(
        "s3", region_name=where.region or None, endpoint_url=where.endpoint_url or None,
        config=Config(max_pool_connections=THREADS * 2,
                      retries={"mode": "standard", "max_attempts": 5},
                      connect_timeout=10, read_timeout=120))


def target_of(dest: Path, prefix: str, key: str) -> Path | None:
    """Where object `key` (under `prefix`) goes below `dest`; None for a directory marker.
    A key that would climb out of dest ('..') is refused."""
    relative = key[len(prefix):].lstrip("/") if prefix else key
    if not relative or key.endswith("/"):
        return None
    parts = PurePosixPath(relative).parts
    if any(p in ("..", ".") for p in parts) or relative.startswith("/"):
        raise CopyError(f"object key {key!r} would be written outside {dest}")
    return dest.joinpath(*parts)


def _listing(client: Any, bucket: str, prefix: str) -> list[dict[str, Any]]:
    paginator = client.get_paginator("list_objects_v2")
    params: dict[str, Any] = {"Bucket": bucket}
    if prefix:
        params["Prefix"] = prefix
    found: list[dict[str, Any]] = []
    for page in paginator.paginate(**params):
        found.extend(page.get("Contents", []))
    return found


def _whole(path: Path, size: int, mtime: float) -> bool:
    try:
        stat = path.stat()
    except OSError:
        return False
    return stat.st_size == size and stat.st_mtime == mtime


def _fetch(client: Any, pool: concurrent.futures.ThreadPoolExecutor, bucket: str,
           item: dict[str, Any], path: Path) -> None:
    size = int(item["Size"])
    partial = path.with_name(f".{path.name}.clusterd-partial")
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.ftruncate(fd, size)
        if size <= RANGE_BYTES:
            _fetch_range(client, bucket, item["Key"], fd, 0, size)
        else:
            ranges = [(start, min(start + RANGE_BYTES, size))
                      for start in range(0, size, RANGE_BYTES)]
            for done in [pool.submit(_fetch_range, client, bucket, item["Key"], fd, a, b)
                         for a, b in ranges]:
                done.result()
    finally:
        os.close(fd)
    mtime = item["LastModified"].timestamp()
    os.utime(partial, (mtime, mtime))
    os.replace(partial, path)


def _fetch_range(client: Any, bucket: str, key: str, fd: int, start: int, end: int) -> None:
    if end <= start:
        return
    answer = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
    offset = start
    body = answer["Body"]
    while chunk := body.read(READ_BYTES):
        os.pwrite(fd, chunk, offset)
        offset += len(chunk)
    if offset != end:
        raise CopyError(f"s3://{bucket}/{key}: got {offset - start} of {end - start} bytes")


def copy(request: BucketCopyRequest) -> BucketCopyReply:
    """Node helper `s3-copy`: copy s3://bucket/prefix to `dest` (a directory; or a file when
    the prefix is one object's key). Says how many objects and bytes were fetched and
    skipped."""
    from botocore.exceptions import BotoCoreError, ClientError

    bucket, prefix = request.bucket, request.prefix or ""
    dest = Path(request.dest).expanduser()
    url = f"s3://{bucket}/{prefix}" if prefix else f"s3://{bucket}"
    client: Any = None
    try:
        client = _client(request)
        listed = _listing(client, bucket, prefix)
        single = [o for o in listed if prefix and o["Key"] == prefix]
        if single and len(listed) == 1:  # the prefix names one object: a file
            work = [(single[0], dest)]
        else:
            below = prefix.rstrip("/") + "/" if prefix else ""
            work = []
            for item in listed:
                if below and not item["Key"].startswith(below):
                    continue  # 'data2/x' is not under the prefix 'data'
                target = target_of(dest, below, item["Key"])
                if target is not None:
                    work.append((item, target))
            dest.mkdir(parents=True, exist_ok=True)
        todo = [(i, p) for i, p in work
                if not _whole(p, int(i["Size"]), i["LastModified"].timestamp())]
        fetched = sum(int(i["Size"]) for i, _ in todo)
        failed: list[str] = []
        lock = threading.Lock()
        # Files on one pool, their ranges on another: a file's thread waiting for its ranges
        # never holds the threads they need.
        with concurrent.futures.ThreadPoolExecutor(THREADS) as ranges, \
                concurrent.futures.ThreadPoolExecutor(THREADS) as files:
            def one(item: dict[str, Any], path: Path) -> None:
                try:
                    _fetch(client, ranges, bucket, item, path)
                except Exception as exc:
                    with lock:
                        failed.append(f"{item['Key']}: {exc}")

            for future in [files.submit(one, i, p) for i, p in todo]:
                future.result()
        if failed:
            raise CopyError(f"{len(failed)} object(s) of {url} could not be copied, e.g. "
                            f"{failed[0]}")
    except ClientError as exc:
        code = exc.response.get("Error", {}).get("Code")
        raise CopyError(f"{url}: {code}: {exc}") from None
    except (BotoCoreError, OSError) as exc:
        raise CopyError(f"{url}: {exc}") from None
    finally:
        if client is not None:
            with contextlib.suppress(Exception):
                client.close()
    return BucketCopyReply(objects=len(todo), bytes=fetched, skipped=len(work) - len(todo))
