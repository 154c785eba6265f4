"""The node helper's typed commands (node_shared/node_commands.py): one definition read by the
daemon that sends a request and by the helper (agent/node.py) that answers it."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from clusterd.agent import node
from clusterd.node_shared.node_commands import (
    TYPED_REQUESTS,
    BadRequest,
    GitCheckoutRequest,
    ProcessState,
    ReadTokenReply,
    StartAgentRequest,
    StartRayRequest,
    StatusReply,
    StatusRequest,
    WritePrivateRequest,
)


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
    code = node.main([command, json.dumps(params)])
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
