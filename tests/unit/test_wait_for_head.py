"""A worker's helper waits for the head's port before Ray starts there (node._wait_for_head):
a refused connection is a head still starting, silence a firewall, said at once."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterd.agent import node, processes


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_head_that_opens_its_port_later_is_waited_for() -> None:
    port = free_port()
    opened: list[socket.socket] = []

    def open_later() -> None:
        time.sleep(0.5)
        listener = socket.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind(("127.0.0.1", port))
        listener.listen(8)
        opened.append(listener)

    thread = threading.Thread(target=open_later)
    thread.start()
    started = time.monotonic()
    try:
        # Refused for half a second: longer than reach_s, which is for silence only.
        node._wait_for_head(f"127.0.0.1:{port}", "127.0.0.2", reach_s=0.1, timeout_s=10)
        assert time.monotonic() - started >= 0.4
    finally:
        thread.join()
        for listener in opened:
            listener.close()


def test_a_head_that_never_opens_its_port_fails_after_the_timeout() -> None:
    port = free_port()
    with pytest.raises(node.HelperError, match="did not open its port within"):
        node._wait_for_head(f"127.0.0.1:{port}", "127.0.0.2", reach_s=30, timeout_s=0.5)


@pytest.fixture
def silent_address() -> Iterator[str]:
    """A port that drops connection attempts, as a firewall does: a listener whose backlog
    is full (Linux then drops new SYNs, and the connect times out)."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(0)
    address = listener.getsockname()
    queued = socket.create_connection(address, timeout=1)
    try:
        yield f"{address[0]}:{address[1]}"
    finally:
        queued.close()
        listener.close()


def test_a_head_behind_silence_is_reported_with_what_to_do(silent_address: str) -> None:
    started = time.monotonic()
    with pytest.raises(node.HelperError) as raised:
        node._wait_for_head(silent_address, "127.0.0.2", reach_s=1.5, timeout_s=60)
    assert time.monotonic() - started < 10  # not the whole start timeout
    message = str(raised.value)
    assert "cannot reach the Ray head" in message and "connection timed out" in message
    assert "security group must let its own members in" in message


def test_a_worker_whose_head_never_opens_leaves_no_process(tmp_path: Path) -> None:
    """A worker's Ray is started (importing) before the wait; a wait that fails ends it, and
    no pid file is left: nothing runs that no record could stop."""
    pid_path, log_path = tmp_path / "ray.pid", tmp_path / "ray.log"
    argv = ["ray", "start", "--block", f"--address=127.0.0.1:{free_port()}"]
    params = {"head_address": argv[-1].split("=", 1)[1], "node_ip": "127.0.0.2"}
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(node.HelperError, match="did not open its port within"):
        node._start_worker_ray(argv, log_path, pid_path, {}, params, timeout=1.0)
    started = [child for child in psutil.Process().children() if child.pid not in before]
    assert len(started) == 1  # it was started before the wait
    assert processes.find(started[0].pid) is None  # and is gone (a zombie at most)
    assert not pid_path.exists()


def test_a_worker_waits_for_the_heads_raylet_not_only_its_gcs(tmp_path: Path) -> None:
    """The head writes its session into the GCS just after the GCS port opens, and starts its
    raylet after that: a worker let go on the GCS port alone often asked too early and looked
    again 2 s later. With the raylet's address named, an open GCS port is not enough."""
    gcs = socket.socket()
    gcs.bind(("127.0.0.1", 0))
    gcs.listen(8)
    try:
        head = f"127.0.0.1:{gcs.getsockname()[1]}"
        argv = ["ray", "start", "--block", f"--address={head}"]
        params = {"head_address": head, "head_raylet_address": f"127.0.0.1:{free_port()}",
                  "node_ip": "127.0.0.2"}
        raylet = params["head_raylet_address"]
        with pytest.raises(node.HelperError, match=f"{raylet} did not open its port"):
            node._start_worker_ray(argv, tmp_path / "ray.log", tmp_path / "ray.pid", {},
                                   params, timeout=1.0)
        assert not (tmp_path / "ray.pid").exists()
    finally:
        gcs.close()


@pytest.fixture
def open_port() -> Iterator[str]:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    try:
        yield f"127.0.0.1:{listener.getsockname()[1]}"
    finally:
        listener.close()


def test_a_worker_waits_for_word_that_the_heads_ray_is_up(tmp_path: Path,
                                                         open_port: str) -> None:
    """Ray asks the GCS for the head's node and, when it is not registered yet, looks again
    only 2 s later: the worker is let go once the daemon says the head is up (a file), not
    when the head's ports open. The word is used once."""
    word = tmp_path / "run" / f"{node.HEAD_STARTED_PREFIX}abc"
    argv = ["ray", "start", "--block", f"--address={open_port}"]
    params = {"head_address": open_port, "head_raylet_address": open_port,
              "node_ip": "127.0.0.2", "head_started_file": str(word)}
    pid_path = tmp_path / "ray.pid"
    with pytest.raises(node.HelperError, match="the Ray head did not start within"):
        node._start_worker_ray(argv, tmp_path / "ray.log", pid_path, {}, params, timeout=0.5)
    assert not pid_path.exists()

    said = threading.Timer(0.4, node.head_started, [{"file": str(word)}])
    said.start()
    started = time.monotonic()
    try:
        pid = node._start_worker_ray(argv, tmp_path / "ray.log", pid_path, {}, params,
                                     timeout=20)
        assert time.monotonic() - started >= 0.3
        assert processes.find(pid) is not None and not word.exists()
    finally:
        said.join()
        node._terminate(pid_path, 5.0)


def test_head_started_writes_only_its_own_kind_of_file(tmp_path: Path) -> None:
    with pytest.raises(node.HelperError, match="not a head-started file"):
        node.head_started({"file": str(tmp_path / "ray.pid")})
    assert not (tmp_path / "ray.pid").exists()
