"""A worker's helper waits for the head's port before Ray starts there (node_spawn.wait_for_head):
a refused connection is a head still starting, silence a firewall, said at once."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterd.agent import node, node_spawn, processes


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
        node_spawn.wait_for_head(f"127.0.0.1:{port}", "127.0.0.2", reach_s=0.1, timeout_s=10)
        assert time.monotonic() - started >= 0.4
    finally:
        thread.join()
        for listener in opened:
            listener.close()


def test_a_head_that_never_opens_its_port_fails_after_the_timeout() -> None:
    port = free_port()
    with pytest.raises(node.HelperError, match="did not open its port within"):
        node_spawn.wait_for_head(f"127.0.0.1:{port}", "127.0.0.2", reach_s=30, timeout_s=0.5)


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
        node_spawn.wait_for_head(silent_address, "127.0.0.2", reach_s=1.5, timeout_s=60)
    assert time.monotonic() - started < 10  # not the whole start timeout
    message = str(raised.value)
    assert "cannot reach the Ray head" in message and "connection timed out" in message
    assert "security group must let its own members in" in message


def test_a_worker_whose_head_never_opens_leaves_no_process(tmp_path: Path) -> None:
    """A worker's Ray is started (importing) before the wait; a wait that fails ends it, and
    no pid file is left: nothing runs that no record could stop."""
    pid_path, log_path = tmp_path / "ray.pid", tmp_path / "ray.log"
    argv = ["ray", "start", "--block", f"--address=127.0.0.1:{free_port()}"]
    before = {child.pid for child in psutil.Process().children()}
    with pytest.raises(node.HelperError, match="did not open its port within"):
        node._start_worker_ray(argv, log_path, pid_path, {}, argv[-1].split("=", 1)[1],
                               "127.0.0.2", timeout=1.0)
    started = [child for child in psutil.Process().children() if child.pid not in before]
    assert len(started) == 1  # it was started before the wait
    assert processes.find(started[0].pid) is None  # and is gone (a zombie at most)
    assert not pid_path.exists()
