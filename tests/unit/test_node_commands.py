"""The node helper's typed commands (node_shared/node_commands.py): one definition read by the
daemon that sends a request and by the helper (agent/node.py) that answers it."""

from __future__ import annotations

import dataclasses
import json
import os
from pathlib import Path
from typing import Any

import pytest

from clusterd.agent import bucket_mount, node
from clusterd.node_shared.node_commands import (
    TYPED_REQUESTS,
    BadRequest,
    BucketCopyRequest,
    BucketFlushRequest,
    BucketMountRequest,
    BucketUnmountRequest,
    GitCheckoutRequest,
    ProcessState,
    RcloneRequest,
    ReadTokenReply,
    Request,
    StartAgentRequest,
    StartRayRequest,
    StatusReply,
    StatusRequest,
    WritePrivateRequest,
)
from clusterd.storage.service import bucket_request
from clusterd.tasks.spec import BucketMount


def test_every_typed_request_has_its_command_on_the_node() -> None:
    names = [request.command for request in TYPED_REQUESTS]
    assert len(set(names)) == len(names)
    assert set(names) <= set(node.COMMANDS)
    assert set(node.TYPED_COMMANDS) == set(TYPED_REQUESTS)


def test_a_request_crosses_as_a_plain_object_and_comes_back_equal() -> None:
    request = StartRayRequest(dir="~/r", temp_key="k", head=True, node_ip="10.0.0.1",
                              num_cpus=0.5, object_store_bytes=1 << 20, token="t",
                              ports={"dashboard_port": 1}, env={"A": "~/b"}, gcs_port=6380)
    sent = json.loads(json.dumps(request.to_dict()))
    assert StartRayRequest.from_dict(sent) == request


def test_a_reply_with_messages_inside_is_read_whole() -> None:
    reply = StatusReply(ray=ProcessState(alive=True, pid=7, address="1.2.3.4:6380"),
                        agent=ProcessState(alive=False, pid=None),
                        autostopped={"reason": "idle", "down": False})
    read = StatusRequest(dir="d").read_reply(json.loads(json.dumps(reply.to_dict())))
    assert read == reply and isinstance(read.ray, ProcessState)


def test_a_missing_field_is_named_and_an_unknown_key_ignored() -> None:
    with pytest.raises(BadRequest, match="StartAgentRequest: missing cluster_name, ray_address"):
        StartAgentRequest.from_dict({"dir": "d", "listen": "unix:s", "state_dir": "s"})
    with pytest.raises(BadRequest, match="expected a JSON object"):
        StatusRequest.from_dict(["d"])  # type: ignore[arg-type]
    assert StatusRequest.from_dict({"dir": "d", "from_a_newer_daemon": 1}) == StatusRequest("d")


def test_secrets_never_show_in_a_repr() -> None:
    shown = " ".join(map(repr, [
        WritePrivateRequest(path="p", token="s3cret-a"), ReadTokenReply(token="s3cret-b"),
        GitCheckoutRequest(url="u", dest="d", token="s3cret-c"),
        StartAgentRequest(dir="d", listen="l", state_dir="s", ray_address="r",
                          cluster_name="c", token="s3cret-d"),
        StartRayRequest(dir="d", temp_key="k", head=False, node_ip="i", num_cpus=1,
                        object_store_bytes=1, token="s3cret-e")]))
    assert "s3cret" not in shown


def run_helper(capsys: pytest.CaptureFixture[str], command: str, params: Any) -> tuple[int, Any]:
    # The helper is a program of its own and sets its process's umask (077); run in this
    # process, it must not leave it to the tests after (a container image built later in
    # this worker had directories its own user could not enter).
    umask = os.umask(0o022)
    os.umask(umask)
    try:
        code = node.main([command, json.dumps(params)])
    finally:
        os.umask(umask)
    return code, json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def test_the_helper_reads_a_typed_request_and_writes_its_reply(
        capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code, reply = run_helper(capsys, "free-ports", {"count": 3})
    assert code == 0 and len(set(reply["ports"])) == 3
    path = tmp_path / "secret"
    code, reply = run_helper(capsys, "write-private", {"path": str(path), "token": "x"})
    assert (code, reply) == (0, {"path": str(path)})
    assert path.read_text() == "x" and path.stat().st_mode & 0o777 == 0o600
    code, reply = run_helper(capsys, "status", {"dir": str(tmp_path / "run")})
    assert code == 0
    assert StatusRequest(dir="").read_reply(reply).ray == ProcessState(False, None, None)


def test_the_helper_refuses_a_request_missing_a_field_with_an_error_reply(
        capsys: pytest.CaptureFixture[str]) -> None:
    code, reply = run_helper(capsys, "free-ports", {})
    assert code == 1 and reply == {"error": "FreePortsRequest: missing count"}


def test_every_request_and_reply_is_a_frozen_dataclass() -> None:
    for request in TYPED_REQUESTS:
        for kind in (request, request.reply_type):
            assert dataclasses.is_dataclass(kind)
            assert kind.__dataclass_params__.frozen, kind  # type: ignore[attr-defined]


# -- the bucket commands --------------------------------------------------------------------------

BUCKET_REQUESTS: list[Request[Any]] = [
    BucketCopyRequest(bucket="b", dest="~/data", prefix="p/q", region="eu-west-1",
                      endpoint_url="http://127.0.0.1:5000", credentials_file="~/c"),
    BucketMountRequest(bucket="b", dest="/ckpt", mode="MOUNT_CACHED", state="~/m",
                       rclone="~/bin/rclone"),
    RcloneRequest(rclone="~/bin/rclone"),
    BucketFlushRequest(state="~/m", timeout=5.0, stalled_grace=1.0),
    BucketUnmountRequest(state="~/m", keep=True, flush_timeout=3.0),
]


@pytest.mark.parametrize("request_", BUCKET_REQUESTS, ids=lambda r: r.command)
def test_a_bucket_request_crosses_as_a_plain_object_and_comes_back_equal(
        request_: Request[Any]) -> None:
    sent = json.loads(json.dumps(request_.to_dict()))
    assert type(request_).from_dict(sent) == request_
    assert type(request_).from_dict({**sent, "from_a_newer_daemon": [1]}) == request_


@pytest.mark.parametrize(("kind", "given", "missing"), [
    (BucketCopyRequest, {"bucket": "b"}, "dest"),
    (BucketMountRequest, {"bucket": "b", "dest": "d", "mode": "MOUNT"}, "state"),
    (BucketFlushRequest, {"timeout": 1}, "state"),
    (BucketUnmountRequest, {"keep": True}, "state"),
])
def test_a_bucket_request_missing_a_field_names_it(kind: type[Request[Any]],
                                                   given: dict[str, Any], missing: str) -> None:
    with pytest.raises(BadRequest, match=f"{kind.__name__}: missing {missing}$"):
        kind.from_dict(given)


def test_the_bucket_requests_keep_the_field_names_of_the_plain_objects_before() -> None:
    """A node with an older helper reads a newer daemon's request by these names (and a
    newer helper an older daemon's): what the daemon sent as plain objects."""
    mount = BucketMount("/ckpt", "b", "p", "MOUNT")
    copy = bucket_request(BucketCopyRequest, mount, {"b": "us-east-2"}, "~/c")
    shared = {"bucket": "b", "prefix": "p", "dest": "/ckpt", "region": "us-east-2",
              "endpoint_url": None, "credentials_file": "~/c"}
    assert copy.to_dict() == shared
    mounted = bucket_request(BucketMountRequest, mount, {}, None, mode="MOUNT", state="~/m",
                             rclone="~/r")
    assert mounted.to_dict() == {**shared, "region": None, "credentials_file": None,
                                 "mode": "MOUNT", "state": "~/m", "rclone": "~/r"}
    assert set(BucketFlushRequest(state="s").to_dict()) == {"state", "timeout", "stalled_grace"}
    assert set(BucketUnmountRequest(state="s").to_dict()) == {
        "state", "keep", "flush_timeout", "stalled_grace"}


def test_the_helper_answers_the_bucket_commands_with_their_replies(
        capsys: pytest.CaptureFixture[str], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))  # no rclone of this machine's
    state = str(tmp_path / "mounts")
    assert run_helper(capsys, "s3-flush", {"state": state}) == (0, {"flushed": []})
    assert run_helper(capsys, "s3-unmount", {"state": state}) == (0, {"unmounted": []})
    old, new = tmp_path / "old-rclone", tmp_path / "new-rclone"
    for path, version in ((old, "1.60.1"), (new, "1.68.2")):
        path.write_text(f"#!/bin/sh\necho 'rclone v{version}'\n")
        path.chmod(0o755)
    code, reply = run_helper(capsys, "s3-rclone", {"rclone": str(new)})
    assert (code, reply["path"], reply["found"]) == (0, str(new), "1.68")
    code, reply = run_helper(capsys, "s3-rclone", {"rclone": str(old)})
    assert (code, reply["path"], reply["found"]) == (0, None, "1.60")
    code, reply = run_helper(capsys, "s3-copy", {"bucket": "b", "prefix": ""})
    assert (code, reply) == (1, {"error": "BucketCopyRequest: missing dest"})


def test_a_mount_record_of_the_file_format_before_is_read_and_written_back_alike(
        tmp_path: Path) -> None:
    """`mounts.json` as helpers wrote it with plain objects: a node upgraded in place still
    finds (and can remount) its mounts; a record not readable is left out, not fatal."""
    params = {"bucket": "b", "prefix": "", "dest": "/ckpt", "region": None,
              "endpoint_url": None, "credentials_file": None, "mode": "MOUNT",
              "state": str(tmp_path), "rclone": None}
    before = {"dest": "/ckpt", "remote": ":s3:b", "mode": "MOUNT", "params": params,
              "pid": 1, "create_time": 0.0, "rc_socket": "/tmp/x/rc.sock", "log": "/l"}
    (tmp_path / "mounts.json").write_text(json.dumps([before, {"dest": "/half"}]))
    (record,) = bucket_mount._records(tmp_path)
    assert record.params == BucketMountRequest(bucket="b", dest="/ckpt", mode="MOUNT",
                                               state=str(tmp_path))
    bucket_mount._save(tmp_path, [record])
    assert json.loads((tmp_path / "mounts.json").read_text()) == [before]
