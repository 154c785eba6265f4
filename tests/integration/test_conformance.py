"""Drive a real clusterd with raw frames: every kind of bad input gets a clean error or a
close, and the daemon goes on serving the next client."""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import struct
import subprocess
from collections.abc import Iterator
from typing import Any

import msgpack
import pytest

from clusterctl import protocol
from tests.support import Daemon, running_daemon


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("cdc-") as d:
        yield d


class Raw:
    def __init__(self, path: os.PathLike[str] | str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(10)
        self.sock.connect(str(path))
        self.decoder = protocol.FrameDecoder()

    def send_raw(self, data: bytes) -> None:
        self.sock.sendall(data)

    def send(self, message: Any) -> None:
        body = msgpack.packb(message, use_bin_type=True)
        self.sock.sendall(struct.pack(">I", len(body)) + body)

    def recv(self) -> dict[str, Any] | None:
        """The next message, or None if the daemon closed the connection."""
        while (message := self.decoder.next_message()) is None:
            chunk = self.sock.recv(65536)
            if not chunk:
                return None
            self.decoder.feed(chunk)
        return message

    def hello(self) -> dict[str, Any]:
        self.send(protocol.hello("conformance-test"))
        reply = self.recv()
        assert reply is not None and reply["type"] == "hello", reply
        return reply

    def call(self, request_id: int, op: str, args: Any) -> dict[str, Any]:
        self.send({"type": "request", "id": request_id, "op": op, "args": args})
        reply = self.recv()
        assert reply is not None
        return reply

    def closed(self) -> bool:
        return self.recv() is None

    def close(self) -> None:
        self.sock.close()


def still_serving(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(1, "ping", {})
    assert reply["ok"] and reply["result"]["pong"] is True
    client.close()
    assert daemon.process is not None and daemon.process.poll() is None


def error_of(message: dict[str, Any] | None) -> str:
    assert message is not None, "expected an error, the daemon closed the connection"
    return str(message["error"]["code"])


def test_hello_then_ping(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    hello = client.hello()
    assert hello["protocol"] == protocol.PROTOCOL_VERSION
    assert hello["server"].startswith("clusterd/")
    assert set(protocol.OPS) <= set(hello["ops"])
    reply = client.call(7, "ping", {})
    assert reply == {"type": "reply", "id": 7, "ok": True,
                     "result": reply["result"]} and reply["result"]["pong"]


def test_request_before_hello_is_refused(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.send({"type": "request", "id": 1, "op": "ping", "args": {}})
    reply = client.recv()
    assert reply is not None and reply["type"] == "error"
    assert error_of(reply) == "HELLO_REQUIRED"
    assert client.closed()
    still_serving(daemon)


def test_wrong_protocol_version(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.send({"type": "hello", "protocol": 999, "client": "future"})
    reply = client.recv()
    assert error_of(reply) == "UNSUPPORTED_VERSION"
    assert "999" in reply["error"]["message"]
    assert client.closed()
    still_serving(daemon)


def test_malformed_msgpack(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    body = b"\xc1\xc1\xc1"  # 0xc1 is never valid msgpack
    client.send_raw(struct.pack(">I", len(body)) + body)
    reply = client.recv()
    assert error_of(reply) == "BAD_FRAME"
    assert client.closed()
    still_serving(daemon)


def test_frame_that_is_not_a_map(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    client.send([1, 2, 3])
    assert error_of(client.recv()) == "BAD_FRAME"
    still_serving(daemon)


def test_frame_over_the_limit_is_refused_from_its_header(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    # Only the header: the daemon must not wait for (or buffer) 100 MB to say no.
    client.send_raw(struct.pack(">I", 100 * 1024 * 1024))
    reply = client.recv()
    assert error_of(reply) == "FRAME_TOO_LARGE"
    assert client.closed()
    still_serving(daemon)


def test_http_garbage_is_a_too_large_frame(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.send_raw(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
    assert error_of(client.recv()) == "FRAME_TOO_LARGE"
    still_serving(daemon)


def test_truncated_frame_then_vanish(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    client.send_raw(struct.pack(">I", 1000) + b"\x81\xa4type")  # 1000 promised, 6 sent
    client.close()
    still_serving(daemon)


def test_unknown_op_keeps_the_connection(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(3, "teleport", {})
    assert reply["id"] == 3 and reply["ok"] is False
    assert error_of(reply) == "UNKNOWN_OP"
    assert "status" in reply["error"]["hint"]
    assert client.call(4, "ping", {})["ok"]


@pytest.mark.parametrize(
    ("op", "args", "field"),
    [
        ("queue", {}, "cluster"),
        ("status", {"clusters": "dev"}, "clusters"),
        ("logs", {"cluster": "dev", "job_id": "7"}, "job_id"),
        ("cancel", {"cluster": "dev", "job_ids": [1, "two"]}, "job_ids"),
        ("launch", {"envs": {"A": 1}}, "envs"),
        ("status", {"refresh": 1}, "refresh"),
        ("ping", {"surprise": True}, "surprise"),
        ("status", [1, 2], "args"),
    ],
)
def test_missing_or_mistyped_fields(daemon: Daemon, op: str, args: Any, field: str) -> None:
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(5, op, args)
    assert error_of(reply) == "INVALID_ARGUMENT"
    assert field in reply["error"]["message"]
    assert client.call(6, "ping", {})["ok"]


@pytest.mark.parametrize(
    ("op", "args", "field"),
    [
        ("logs", {"cluster": "dev", "tail": -1}, "tail"),
        ("logs", {"cluster": "dev", "tail": 10**12}, "tail"),
        ("logs", {"cluster": "dev", "offset": -5}, "offset"),
        ("logs", {"cluster": "dev", "job_id": 2**63}, "job_id"),
        ("logs", {"cluster": "dev", "job_id": 0}, "job_id"),
        ("cancel", {"cluster": "dev", "job_ids": [-1]}, "job_ids"),
        ("launch", {"command": "true", "idle_minutes": float("nan")}, "idle_minutes"),
        ("launch", {"command": "true", "idle_minutes": float("inf")}, "idle_minutes"),
        ("launch", {"command": "true", "idle_minutes": -1.0}, "idle_minutes"),
        ("launch", {"command": "true", "num_nodes": 10**9}, "num_nodes"),
        ("autostop", {"cluster": "dev", "idle_minutes": float("-inf")}, "idle_minutes"),
    ],
)
def test_numbers_out_of_range(daemon: Daemon, op: str, args: Any, field: str) -> None:
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(5, op, args)
    assert error_of(reply) == "INVALID_ARGUMENT", reply
    assert field in reply["error"]["message"]
    assert client.call(6, "ping", {})["ok"]


def test_request_without_an_integer_id(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    client.send({"type": "request", "id": "one", "op": "ping", "args": {}})
    reply = client.recv()
    assert reply is not None and reply["type"] == "error"
    assert error_of(reply) == "INVALID_ARGUMENT"
    assert client.call(2, "ping", {})["ok"]


def test_unknown_message_type(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    client.send({"type": "gossip", "id": 9})
    reply = client.recv()
    assert reply is not None and reply["id"] == 9 and error_of(reply) == "BAD_FRAME"
    assert client.call(10, "ping", {})["ok"]


def test_bad_cluster_names_and_unknown_clusters(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    assert error_of(client.call(1, "queue", {"cluster": "no such"})) == "INVALID_NAME"
    assert error_of(client.call(2, "queue", {"cluster": "x" * 5000})) == "INVALID_NAME"
    reply = client.call(3, "exec", {"cluster": "ghost", "command": "true"})
    assert error_of(reply) == "CLUSTER_NOT_FOUND"
    assert "clusterctl status" in reply["error"]["hint"]


def test_bad_task_yaml_names_the_field(daemon: Daemon, tmp_path: Any) -> None:
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(1, "launch", {"yaml_text": "resources:\n  cpus: [1]\nrun: x\n",
                                      "source": "bad.yaml"})
    assert error_of(reply) == "INVALID_TASK"
    assert reply["error"]["message"].startswith("bad.yaml: resources.cpus:")
    reply = client.call(2, "launch", {"yaml_text": "run: [unclosed\n", "source": "b.yaml"})
    assert error_of(reply) == "INVALID_TASK" and "line" in reply["error"]["message"]


def test_many_requests_in_flight_on_one_connection(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    for request_id in range(1, 101):
        client.send({"type": "request", "id": request_id, "op": "ping", "args": {}})
    seen = set()
    for _ in range(100):
        reply = client.recv()
        assert reply is not None and reply["ok"]
        seen.add(reply["id"])
    assert seen == set(range(1, 101))


def test_huge_valid_request_is_refused_and_daemon_survives(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    client.hello()
    big = "x" * (protocol.MAX_FRAME_BYTES + 10)
    # The daemon may say no and hang up before all 8 MB are sent.
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        client.send({"type": "request", "id": 1, "op": "launch", "args": {"command": big}})
    try:
        reply = client.recv()
    except ConnectionResetError:
        reply = None
    if reply is not None:
        assert error_of(reply) == "FRAME_TOO_LARGE"
    still_serving(daemon)


def test_client_of_another_uid_is_refused(daemon: Daemon) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    # Loosen the modes as a careless admin might; the peer uid check must still refuse.
    daemon.socket.parent.chmod(0o755)
    daemon.socket.chmod(0o666)
    os.chmod(daemon.root, 0o755)
    os.chmod(daemon.socket.parent.parent, 0o755)
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that another user can run")
    hello = protocol.encode_frame(protocol.hello("intruder")).hex()
    # The intruder is plain Python (it cannot read root's venv): it sends our hello bytes and
    # prints the raw reply for us to decode.
    code = (
        "import socket, struct, sys\n"
        "s = socket.socket(socket.AF_UNIX)\n"
        f"s.connect({str(daemon.socket)!r})\n"
        "try:\n"
        f"    s.sendall(bytes.fromhex({hello!r}))\n"
        "except BrokenPipeError:\n"
        "    pass  # refused before reading: its one error frame is waiting for us\n"
        "n = struct.unpack('>I', s.recv(4))[0]\n"
        "body = b''\n"
        "while len(body) < n:\n"
        "    body += s.recv(n - len(body))\n"
        "print(body.hex())\n"
    )
    try:
        result = subprocess.run([python, "-c", code], user=65534, capture_output=True,
                                text=True, timeout=30)
        assert result.returncode == 0, result.stderr
        reply = msgpack.unpackb(bytes.fromhex(result.stdout.strip()))
        assert reply["type"] == "error"
        assert reply["error"]["code"] == "PERMISSION_DENIED"
    finally:
        daemon.socket.parent.chmod(0o700)
        daemon.socket.chmod(0o600)
    still_serving(daemon)


def test_socket_and_directory_modes(daemon: Daemon) -> None:
    assert daemon.socket.parent.stat().st_mode & 0o777 == 0o700
    assert daemon.socket.stat().st_mode & 0o777 == 0o600


def test_a_fifo_as_task_path_is_refused_at_once(daemon: Daemon, tmp_path: Any) -> None:
    fifo = tmp_path / "task.yaml"
    os.mkfifo(fifo)
    client = Raw(daemon.socket)
    client.hello()
    reply = client.call(1, "launch", {"yaml_path": str(fifo), "cluster": "fifo"})
    assert error_of(reply) == "INVALID_TASK"
    assert "not a regular file" in reply["error"]["message"]
    still_serving(daemon)


def test_new_ops_check_their_arguments(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    assert {"follow_request", "nodes", "jobs_events"} <= set(client.hello()["ops"])
    assert error_of(client.call(1, "nodes", {})) == "INVALID_ARGUMENT"
    assert error_of(client.call(2, "follow_request", {"request_id": "7"})) == "INVALID_ARGUMENT"
    assert error_of(client.call(5, "follow_request", {"request_id": -1})) == "INVALID_ARGUMENT"
    assert error_of(client.call(3, "nodes", {"cluster": "ghost"})) == "CLUSTER_NOT_FOUND"
    reply = client.call(4, "follow_request", {"request_id": 999_999})
    assert error_of(reply) == "REQUEST_NOT_FOUND" and "999999" in reply["error"]["message"]
    assert error_of(client.call(6, "jobs_events", {})) == "INVALID_ARGUMENT"
    assert error_of(client.call(7, "jobs_events", {"job_id": 0})) == "INVALID_ARGUMENT"
    assert error_of(client.call(8, "jobs_events", {"job_id": 1, "after": -1})
                    ) == "INVALID_ARGUMENT"
    reply = client.call(9, "jobs_events", {"job_id": 424_242})
    assert error_of(reply) == "MANAGED_JOB_NOT_FOUND" and "424242" in reply["error"]["message"]


def test_the_ssh_op_checks_its_arguments(daemon: Daemon) -> None:
    client = Raw(daemon.socket)
    assert "ssh" in client.hello()["ops"]
    assert error_of(client.call(1, "ssh", {})) == "INVALID_ARGUMENT"
    assert error_of(client.call(2, "ssh", {"cluster": "dev", "node": "1"})) == "INVALID_ARGUMENT"
    assert error_of(client.call(3, "ssh", {"cluster": "dev", "node": -1})) == "INVALID_ARGUMENT"
    reply = client.call(4, "ssh", {"cluster": "ghost"})
    assert error_of(reply) == "CLUSTER_NOT_FOUND" and "ghost" in reply["error"]["message"]
    still_serving(daemon)


def frames_until_reply(client: Raw, request_id: int) -> tuple[list[dict[str, Any]],
                                                                dict[str, Any]]:
    events = []
    while True:
        message = client.recv()
        assert message is not None, "the daemon closed the connection"
        if message.get("id") != request_id:
            continue
        if message["type"] == "reply":
            return events, message
        events.append(message)


def test_follow_a_request_another_client_started(daemon: Daemon) -> None:
    """A launch started on one connection, followed from another while it runs: its progress
    from the start, live, then its result; `requests` shows its latest step meanwhile; once it
    has ended, following it replays the steps it kept and answers from its record; its
    cluster's nodes are listed."""
    launcher = Raw(daemon.socket)
    launcher.hello()
    launcher.send({"type": "request", "id": 1, "op": "launch",
                   "args": {"cluster": "follow", "command": "echo followed", "detach": True}})
    first = launcher.recv()
    assert first is not None and first["event"] == "request", first
    request_id = first["data"]["request_id"]
    follower = Raw(daemon.socket)
    follower.sock.settimeout(120)
    follower.hello()
    follower.send({"type": "request", "id": 5, "op": "follow_request",
                   "args": {"request_id": request_id}})
    watcher = Raw(daemon.socket)
    watcher.hello()
    listed = watcher.call(1, "requests", {})["result"]["running"]
    mine = next(r for r in listed if r["id"] == request_id)
    assert mine["op"] == "launch" and mine["cluster"] == "follow"
    assert mine["started_at"] > 0 and "blocked" in mine
    try:
        events, reply = frames_until_reply(follower, 5)
        names = [e["event"] for e in events]
        assert names[0] == "request" and events[0]["data"]["request_id"] == request_id
        assert "progress" in names and "job" in names, names
        # The very first step is there, though the follower came in after it.
        progress = [e["data"] for e in events if e["event"] == "progress"]
        assert progress[0]["message"].startswith("checking where follow can run")
        assert reply["ok"], reply
        result = reply["result"]
        assert result["request_id"] == request_id and result["cluster"] == "follow"
        assert isinstance(result["job_id"], int)
        launched = frames_until_reply(launcher, 1)[1]
        assert launched["ok"] and launched["result"]["job_id"] == result["job_id"]

        # Over: its record answers, after the steps it kept (the same as were followed live).
        follower.send({"type": "request", "id": 6, "op": "follow_request",
                       "args": {"request_id": request_id}})
        kept, again = frames_until_reply(follower, 6)
        assert [(e["event"], e["data"]) for e in kept] == [
            (e["event"], e["data"]) for e in events
            if e["event"] in ("request", "progress", "blocked", "job")]
        assert again["ok"] and again["result"]["job_id"] == result["job_id"]
        assert again["result"]["request_id"] == request_id

        nodes = watcher.call(2, "nodes", {"cluster": "follow"})["result"]
        assert nodes["cluster"] == "follow"
        assert [(n["role"], n["status"], n["internal_ip"], n["ssh"]) for n in nodes["nodes"]
                ] == [("head", "running", "127.0.0.1", None)]
    finally:
        result = daemon.ctl("down", "-y", "follow")
        assert result.returncode == 0, result.stderr
    assert error_of(watcher.call(3, "nodes", {"cluster": "follow"})) == "CLUSTER_NOT_FOUND"
