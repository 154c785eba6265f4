"""Fuzzing a real daemon (hypothesis): random and mutated frames, each on a connection of its
own, then a ping. Whatever a frame holds, the daemon answers it (or closes that connection)
within seconds, its memory stays bounded, and it goes on serving."""

from __future__ import annotations

import socket
import struct
import time
from collections.abc import Iterator
from typing import Any

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from clusterctl import protocol
from tests.integration.test_conformance import still_serving
from tests.support import Daemon, running_daemon
from tests.unit.test_fuzz import edits, mutate, values

FUZZ = settings(max_examples=60, deadline=None, derandomize=True, database=None,
                suppress_health_check=[HealthCheck.too_slow,
                                       HealthCheck.function_scoped_fixture])
# Ops with arguments that can do nothing lasting: launch goes to a provider that does not
# exist (after loading the task: the loader is fuzzed too), the rest name no cluster.
safe_requests = st.builds(
    lambda op, args, request_id: {"type": "request", "id": request_id, "op": op,
                                  "args": {**args, **({"infra": "nowhere"} if op == "launch"
                                                      else {"cluster": "nope"})}},
    st.sampled_from(["launch", "exec", "queue", "logs", "cancel", "down", "autostop",
                     "events", "status", "ping", "teleport"]),
    st.dictionaries(st.sampled_from(["yaml_text", "job_id", "tail", "offset", "idle_minutes",
                                     "num_nodes", "envs", "secrets", "limit", "follow",
                                     "job_ids", "x" * 300]), values, max_size=5),
    st.one_of(st.integers(0, 2**63), st.text(max_size=3), st.none()),
)


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    with running_daemon("cdf-") as d:
        yield d


def exchange(daemon: Daemon, data: bytes, hello: bool) -> None:
    """Send `data` (after a hello, or as the first bytes) and read until the daemon has
    answered or closed; both must come within seconds."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(str(daemon.socket))
        decoder = protocol.FrameDecoder()
        if hello:
            sock.sendall(protocol.encode_frame(protocol.hello("fuzz")))
        try:
            sock.sendall(data)
            sock.shutdown(socket.SHUT_WR)  # then, whatever came, the daemon must be done
        except (BrokenPipeError, ConnectionResetError):
            return  # refused mid-send (a frame too large): fine
        started = time.monotonic()
        try:
            while chunk := sock.recv(65536):
                decoder.feed(chunk)
                for _ in decoder.drain():
                    pass
        except (ConnectionResetError, protocol.ProtocolError):
            pass
        except TimeoutError:
            # A follow (events, logs) may legitimately go on; it must not hold the daemon.
            pass
        assert time.monotonic() - started < 15


@FUZZ
@given(st.lists(safe_requests, min_size=1, max_size=3), edits, st.booleans())
def test_fuzzed_frames_never_take_the_daemon_down(daemon: Daemon,
                                                 messages: list[dict[str, Any]],
                                                 changes: list[tuple[int, int, int]],
                                                 hello: bool) -> None:
    stream = b"".join(protocol.encode_frame(m) for m in messages)
    exchange(daemon, stream, hello)
    exchange(daemon, mutate(stream, changes), hello)


@FUZZ
@given(st.binary(max_size=3000))
def test_random_bytes_never_take_the_daemon_down(daemon: Daemon, data: bytes) -> None:
    exchange(daemon, struct.pack(">I", len(data)) + data, True)


def test_after_the_fuzzing_the_daemon_serves_and_is_no_bigger(daemon: Daemon) -> None:
    still_serving(daemon)
    assert daemon.process is not None
    rss = psutil.Process(daemon.process.pid).memory_info().rss
    assert rss < 400 * 2**20, f"the daemon uses {rss / 2**20:.0f} MiB"
    log = daemon.log()
    for bug in ("handler crashed", "request crashed", "connection failed"):
        assert bug not in log, bug  # each would be an INTERNAL error: a bug in clusterd
