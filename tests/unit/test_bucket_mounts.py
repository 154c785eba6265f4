"""Bucket entries of `file_mounts` as SkyPilot's task files write them: what each loads as,
and every malformed entry refused naming its field."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd.tasks.buckets import bucket_name_problem
from clusterd.tasks.loader import TaskError, load_task
from clusterd.tasks.spec import BucketMount, TaskSpec


def load(text: str, tmp_path: Path, **kwargs: object) -> TaskSpec:
    return load_task(yaml_text=text, source="t.yaml", cwd=str(tmp_path), **kwargs)


def refusal(text: str, tmp_path: Path) -> TaskError:
    with pytest.raises(TaskError) as caught:
        load(text, tmp_path)
    return caught.value


def test_an_s3_url_is_a_copy_of_its_prefix(tmp_path: Path) -> None:
    spec = load("file_mounts:\n  /data: s3://my-data/imagenet//train/\n  /x: .\n", tmp_path)
    assert spec.bucket_mounts == (BucketMount("/data", "my-data", "imagenet/train", "COPY"),)
    assert spec.file_mounts == {"/x": str(tmp_path)}
    assert spec.bucket_mounts[0].url == "s3://my-data/imagenet/train"


def test_the_entry_form_with_a_name_is_made_if_missing_and_mounted(tmp_path: Path) -> None:
    spec = load("envs:\n  RUN: r7\nfile_mounts:\n  /ckpt:\n    name: ckpt-${RUN}\n", tmp_path)
    assert spec.bucket_mounts == (BucketMount("/ckpt", "ckpt-r7", mode="MOUNT", create=True),)


def test_the_entry_form_with_an_s3_source(tmp_path: Path) -> None:
    spec = load("file_mounts:\n  ~/c:\n    source: s3://b-1/p\n    mode: mount_cached\n"
                "    store: S3\n    persistent: false\n", tmp_path)
    assert spec.bucket_mounts == (BucketMount("~/c", "b-1", "p", "MOUNT_CACHED",
                                              persistent=False),)


def test_a_local_source_is_uploaded_to_the_named_bucket(tmp_path: Path) -> None:
    (tmp_path / "ds").mkdir()
    spec = load("file_mounts:\n  /ds:\n    name: up-bucket\n    source: ./ds\n    mode: COPY\n",
                tmp_path)
    assert spec.bucket_mounts == (BucketMount("/ds", "up-bucket", mode="COPY",
                                              local_source=str(tmp_path / "ds"), create=True),)


@pytest.mark.parametrize(("entry", "field", "says"), [
    ("gs://bucket/x", "file_mounts./d", "gs:// is not offered: only S3"),
    ("https://acct.blob.core.windows.net/c", "file_mounts./d", "https:// is not offered"),
    ("s3://Bad_Name/x", "file_mounts./d", "'Bad_Name' in 's3://Bad_Name/x': a bucket name"),
    ("{name: b-b, store: gcs}", "file_mounts./d.store", "'gcs' is not offered: only S3"),
    ("{name: b-b, mode: SYNC}", "file_mounts./d.mode", "'SYNC' is not a mode"),
    ("{name: b-b, persistent: maybe}", "file_mounts./d.persistent", "expected true or false"),
    ("{name: b-b, colour: red}", "file_mounts./d.colour", "unknown field"),
    ("{mode: MOUNT}", "file_mounts./d", "needs a name or a source"),
    ("{source: [a, b], name: b-b}", "file_mounts./d.source", "a list of sources"),
    ("{source: ./nope, name: b-b}", "file_mounts./d.source", "is not a directory"),
    ("{source: ., mode: COPY}", "file_mounts./d.name", "needs the name of the bucket"),
    ("{source: s3://one/p, name: two}", "file_mounts./d.name", "is not the bucket of its"),
    ("{name: 192.168.1.1}", "file_mounts./d.name", "not formatted as an IP address"),
    ("{name: a..b}", "file_mounts./d.name", "no two dots"),
    ("[1, 2]", "file_mounts./d", "expected a local path, an s3:// URL or a map"),
])
def test_bad_entries_are_refused_naming_the_field(tmp_path: Path, entry: str, field: str,
                                                  says: str) -> None:
    error = refusal(f"file_mounts:\n  /d: {entry}\n", tmp_path)
    assert error.message.startswith(f"t.yaml: {field}: "), error.message
    assert says in error.message, error.message


@pytest.mark.parametrize("name", ["ab", "a" * 64, "-ab", "ab-", "aB1", "xn--ab", "ab-s3alias"])
def test_bucket_names_aws_would_refuse(name: str) -> None:
    assert bucket_name_problem(name) is not None


@pytest.mark.parametrize("name", ["abc", "a" * 63, "my.bucket-1", "1-2-3"])
def test_bucket_names_aws_takes(name: str) -> None:
    assert bucket_name_problem(name) is None
