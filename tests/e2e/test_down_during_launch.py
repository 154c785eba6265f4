"""`clusterctl down` calls off a launch in whatever phase it is, on the ssh test bed (one real
sshd host): waiting for a host that never speaks SSH, installing the runtime on a node that
stopped answering, and starting Ray on a node. Each time the down returns in a fraction of
the wait the launch would otherwise have, the launch fails saying it was called off, and no
record, process or file of the cluster is left. (Waiting to retry, `--retry-until-up`, is
test_failover.py's, on the EC2 bed.)"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import (
    CONNECT_ATTEMPTS,
    CONNECT_TIMEOUT_S,
    KEEPALIVE_INTERVAL_S,
    SSHConnections,
)
from clusterd.ssh.host_keys import HostKeyStore
from tests.e2e.sshbed import Bed, ssh_bed
from tests.support import read_until, wait_for

pytestmark = pytest.mark.ray

# How long a launch waits for a host that accepts connections but never speaks SSH (every
# connection attempt times out), and for a node whose connection froze (until keepalives
# give up on it): a down must not wait for either.
MUTE_HOST_WAIT_S = CONNECT_TIMEOUT_S * CONNECT_ATTEMPTS
FROZEN_NODE_WAIT_S = KEEPALIVE_INTERVAL_S * 3


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(count=1) as made:
        yield made


def ctl(bed: Bed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return bed.daemon.ctl(*args, timeout=timeout)


def timed_down(bed: Bed, name: str) -> tuple[subprocess.CompletedProcess[str], float]:
    started = time.monotonic()
    down = ctl(bed, "down", "-y", name, timeout=600)
    return down, time.monotonic() - started


def assert_called_off(launch: subprocess.Popen[str], name: str) -> str:
    _, err = launch.communicate(timeout=120)
    assert launch.returncode == 1, err
    assert "[PREEMPTED]" in err and f"launch of {name} was called off by request" in err, err
    assert f"cluster {name} is UP" not in err
    return err


def runtime_files(bed: Bed) -> list[str]:
    """What the node's user has where clusters keep their runtime and Ray's temp files."""
    found = bed.ssh(0, "find ~/.clusterd/clusters /tmp/clusterd-ray-$(id -u) -mindepth 1 "
                       "-maxdepth 1 2>/dev/null")
    return sorted(found.stdout.split("\n"))


def assert_nothing_left(bed: Bed, name: str, files_before: list[str]) -> None:
    assert bed.daemon.cluster(name) is None
    events = json.loads(ctl(bed, "events", name, "--json").stdout)
    assert events[-1]["to_status"] == "TERMINATED", events[-1]
    # The node: no process of the cluster's user (but its sshd), none of its files.
    wait_for(lambda: not bed.user_pids(0), 30, "the node's processes to go")
    assert runtime_files(bed) == files_before
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert [h["cluster"] for h in check if h["pool"] == "testbed"] == [None]


@contextlib.contextmanager
def launching(bed: Bed, name: str, infra: str) -> Iterator[subprocess.Popen[str]]:
    """`clusterctl launch` of a one-node cluster, running in the background (killed if the
    test leaves it running)."""
    launch = bed.daemon.popen_ctl("launch", "-c", name, "--infra", infra, "--", "true")
    try:
        yield launch
    finally:
        if launch.poll() is None:
            launch.kill()
            launch.wait()


@contextlib.contextmanager
def frozen_sessions(user: str) -> Iterator[list[int]]:
    """Stop (SIGSTOP) the sshd sessions of `user`: the daemon's connection to the node hangs,
    as a node that stopped answering would; they go on (SIGCONT) afterwards."""
    found = subprocess.run(["pgrep", "-u", user, "-x", "sshd"], capture_output=True,
                           text=True).stdout.split()
    pids = [int(p) for p in found]
    assert pids, f"no sshd session of {user}"
    for pid in pids:
        os.kill(pid, signal.SIGSTOP)
    try:
        yield pids
    finally:
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)


@pytest.mark.anyio
async def test_a_remote_command_given_up_on_stops_on_the_node(bed: Bed, tmp_path: Path) -> None:
    """A command the daemon stops waiting for (cancelled: a launch called off) does not go on
    running on the node: its process group gets SIGTERM and its channel is closed."""
    host = bed.hosts[0]
    target = SSHTarget(host["ip"], host["port"], host["user"], bed.key)
    connections = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))

    async def running() -> list[str]:  # the commands the user runs, but its sshd
        listed = await anyio.run_process(["ps", "-o", "comm=", "-u", host["user"]],
                                         check=False)
        return [c for c in listed.stdout.decode().split() if c != "sshd"]

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(connections.run, target, "sleep 300 & sleep 301; wait")
            with anyio.fail_after(30):
                while (await running()).count("sleep") < 2:
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        with anyio.fail_after(10):
            while await running():
                await anyio.sleep(0.1)
    finally:
        await connections.close_all()


def test_down_during_the_wait_for_ssh_returns_at_once(bed: Bed) -> None:
    """A pool host whose port accepts connections and never says a word of SSH: the launch
    sits in its wait for SSH (each attempt times out); down calls it off at once."""
    mute = socket.socket()
    mute.bind(("127.0.0.1", 0))
    mute.listen(8)
    accepted: list[socket.socket] = []

    def accept() -> None:
        with contextlib.suppress(OSError):
            while True:
                accepted.append(mute.accept()[0])  # kept open, never written to

    threading.Thread(target=accept, daemon=True).start()
    original = bed.pools_file.read_text()
    bed.pools_file.write_text(original + f"mute:\n  identity_file: {bed.key}\n  hosts:\n"
                              f"    - ip: 127.0.0.1\n      user: nobody\n"
                              f"      port: {mute.getsockname()[1]}\n")
    try:
        with launching(bed, "mute", "ssh/mute") as launch:
            read_until(launch, "creating nodes on ssh/mute", 60)
            wait_for(lambda: accepted, 30, "the launch to connect to the mute host")
            down, took = timed_down(bed, "mute")
            assert down.returncode == 0, down.stderr
            assert took < MUTE_HOST_WAIT_S / 4, f"down took {took:.1f} s"
            assert "calling off request" in down.stderr
            assert_called_off(launch, "mute")
        assert bed.daemon.cluster("mute") is None
        events = json.loads(ctl(bed, "events", "mute", "--json").stdout)
        assert "launch failed: called off by request" in events[-1]["reason"], events[-1]
    finally:
        bed.pools_file.write_text(original)
        mute.close()
        for conn in accepted:
            conn.close()


def test_down_during_the_runtime_install_on_a_node_that_hangs(bed: Bed) -> None:
    """The node stops answering while the runtime installs (its sshd session frozen): the
    launch would wait until keepalives give up on the connection; down calls it off at once,
    and nothing of the cluster's is left on the node once it answers again."""
    files_before = runtime_files(bed)
    with launching(bed, "hung", "ssh/testbed") as launch:
        read_until(launch, "installing the runtime", 300)
        with frozen_sessions(bed.hosts[0]["user"]):
            down, took = timed_down(bed, "hung")
            assert down.returncode == 0, down.stderr + bed.daemon.log()[-3000:]
            assert took < FROZEN_NODE_WAIT_S / 4, f"down took {took:.1f} s"
            assert_called_off(launch, "hung")
    assert_nothing_left(bed, "hung", files_before)


def test_down_during_ray_start_stops_what_was_started(bed: Bed) -> None:
    """Called off while Ray starts on the node: the launch stops what it started (Ray, by
    its pid file) and removes its files before the down finishes."""
    files_before = runtime_files(bed)
    with launching(bed, "rayed", "ssh/testbed") as launch:
        read_until(launch, "starting Ray on 1 node(s)", 600)
        wait_for(lambda: "gcs_server" in subprocess.run(
            ["ps", "-o", "comm=", "-u", bed.hosts[0]["user"]], capture_output=True,
            text=True).stdout, 60, "Ray's processes on the node")
        down, _ = timed_down(bed, "rayed")
        assert down.returncode == 0, down.stderr + bed.daemon.log()[-3000:]
        assert_called_off(launch, "rayed")
    assert_nothing_left(bed, "rayed", files_before)
