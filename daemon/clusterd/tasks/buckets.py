"""`file_mounts` entries backed by buckets, read as SkyPilot reads them:

    /data: s3://bucket/prefix            # COPY of the objects under prefix
    /ckpt:                               # the entry form
      name: my-bucket                    # made if missing (without an s3:// source)
      source: ./local_dir | s3://b/p     # uploaded first (local) or used as it is (s3)
      store: s3
      mode: MOUNT | COPY | MOUNT_CACHED  # MOUNT when not given, as in SkyPilot
      persistent: true | false           # false: deleted with the cluster, if clusterd made it

Only S3 is offered: other stores and URL schemes are refused by name."""

from __future__ import annotations

import ipaddress
import os
import re
from collections.abc import Mapping
from typing import Any

from clusterd.tasks.common import TaskError, expand, kind, local_path, shown
from clusterd.tasks.spec import BucketMount

MODES = ("MOUNT", "COPY", "MOUNT_CACHED")
ENTRY_FIELDS = frozenset({"name", "source", "store", "mode", "persistent"})
BUCKET_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]$")
ONLY_S3 = "only S3 buckets are offered (s3://... or store: s3)"


def is_bucket_url(text: str) -> bool:
    return "://" in text


def bucket_name_problem(name: str) -> str | None:
    """Why `name` is not a valid S3 bucket name, or None (AWS's rules for new buckets)."""
    if not BUCKET_NAME.match(name):
        return ("a bucket name is 3 to 63 lowercase letters, digits, dots and hyphens, "
                "beginning and ending with a letter or digit")
    if ".." in name or ".-" in name or "-." in name:
        return "a bucket name has no two dots, or a dot and a hyphen, next to each other"
    try:
        ipaddress.IPv4Address(name)
    except ValueError:
        pass
    else:
        return "a bucket name is not formatted as an IP address"
    if name.startswith(("xn--", "sthree-")) or name.endswith(("-s3alias", "--ol-s3")):
        return "a bucket name does not begin with xn-- or sthree-, nor end with -s3alias"
    return None


def parse_s3_url(url: str, source: str, field: str) -> tuple[str, str]:
    """s3://bucket[/prefix] -> (bucket, prefix without a leading or doubled '/')."""
    if not url.startswith("s3://"):
        scheme = url.split("://", 1)[0]
        raise TaskError(source, field, f"{shown(url)}: {scheme}:// is not offered: {ONLY_S3}")
    bucket, _, prefix = url[len("s3://"):].partition("/")
    problem = bucket_name_problem(bucket)
    if problem is not None:
        raise TaskError(source, field, f"{shown(bucket)} in {shown(url)}: {problem}")
    if any(c in prefix for c in "\n\r\0"):
        raise TaskError(source, field, f"{shown(url)}: a key prefix is on one line")
    return bucket, "/".join(part for part in prefix.split("/") if part)


def parse_bucket_mount(remote: str, value: Any, source: str, cwd: str,
                       envs: Mapping[str, str]) -> BucketMount:
    """One `file_mounts` entry whose value is an s3:// URL or a {name, source, ...} map."""
    field = f"file_mounts.{remote}"
    if isinstance(value, str):
        bucket, prefix = parse_s3_url(expand(value, envs), source, field)
        return BucketMount(remote, bucket, prefix, mode="COPY")
    if not isinstance(value, dict):
        raise TaskError(source, field, f"expected a local path, an s3:// URL or a map "
                                       f"{{name, source, mode, ...}}, got {kind(value)}")
    unknown = sorted(str(k) for k in value if k not in ENTRY_FIELDS)
    if unknown:
        raise TaskError(source, f"{field}.{unknown[0]}", "unknown field",
                        f"a bucket entry has {', '.join(sorted(ENTRY_FIELDS))}")
    store = value.get("store")
    if store is not None:
        if not isinstance(store, str):
            raise TaskError(source, f"{field}.store", f"expected a store name, got "
                                                      f"{kind(store)}")
        if store.lower() != "s3":
            raise TaskError(source, f"{field}.store", f"{shown(store)} is not offered: {ONLY_S3}")
    mode_value = value.get("mode", "MOUNT")
    if not isinstance(mode_value, str) or mode_value.upper() not in MODES:
        raise TaskError(source, f"{field}.mode", f"{shown(mode_value)} is not a mode",
                        f"one of {', '.join(MODES)}")
    mode = mode_value.upper()
    persistent = value.get("persistent", True)
    if not isinstance(persistent, bool):
        raise TaskError(source, f"{field}.persistent", f"expected true or false, got "
                                                       f"{kind(persistent)}")
    name = value.get("name")
    if name is not None:
        if not isinstance(name, str):
            raise TaskError(source, f"{field}.name", f"expected a bucket name, got {kind(name)}")
        name = expand(name, envs)
        problem = bucket_name_problem(name)
        if problem is not None:
            raise TaskError(source, f"{field}.name", f"{shown(name)}: {problem}")
    origin = value.get("source")
    if isinstance(origin, list):
        raise TaskError(source, f"{field}.source", "a list of sources is not offered",
                        "give one local directory or one s3:// URL")
    if origin is not None and not isinstance(origin, str):
        raise TaskError(source, f"{field}.source", f"expected a local directory or an s3:// "
                                                   f"URL, got {kind(origin)}")
    if origin is None:
        if name is None:
            raise TaskError(source, field, "a bucket entry needs a name or a source",
                            "name: a bucket to use (made if missing), or source: s3://...")
        return BucketMount(remote, name, mode=mode, create=True, persistent=persistent)
    origin = expand(origin, envs)
    if is_bucket_url(origin):
        bucket, prefix = parse_s3_url(origin, source, f"{field}.source")
        if name is not None and name != bucket:
            raise TaskError(source, f"{field}.name", f"{shown(name)} is not the bucket of its "
                                                     f"source {shown(origin)}",
                            "leave name out when the source is an s3:// URL")
        return BucketMount(remote, bucket, prefix, mode=mode, persistent=persistent)
    if name is None:
        raise TaskError(source, f"{field}.name", "a local source needs the name of the bucket "
                                                 "to upload it to")
    path = local_path(origin, cwd)
    if not os.path.isdir(path):
        raise TaskError(source, f"{field}.source", f"{path} is not a directory")
    return BucketMount(remote, name, mode=mode, local_source=path, create=True,
                       persistent=persistent)
