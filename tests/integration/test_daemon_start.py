"""How clusterd comes to life: socket activation with a real passed fd, autostart by
clusterctl (once, even when raced), and a clean SIGTERM."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterctl import Client, ClusterdError, PingArgs
from tests.support import (
    CLUSTERCTL,
    Daemon,
    connectable,
    daemons_of,
    make_env,
    needs_tool,
    pid_alive,
    short_tempdir,
    wait_for,
)


@pytest.fixture
def env() -> Iterator[dict[str, str]]:
    root = short_tempdir("cdd-")
    environment = make_env(root)
    environment["CLUSTERD_TEST_ROOT"] = str(root)
    try:
        yield environment
    finally:
        for pid in daemons_of(Path(environment["XDG_RUNTIME_DIR"])):
            os.kill(pid, signal.SIGKILL)
        shutil.rmtree(root, ignore_errors=True)


def socket_path(env: dict[str, str]) -> Path:
    return Path(env["XDG_RUNTIME_DIR"]) / "clusterd" / "clusterd.sock"


def ping(env: dict[str, str]) -> dict[str, object]:
    with Client(socket_path(env), autostart=False) as client:
        return client.call(PingArgs())


def test_socket_activation_uses_the_passed_fd(env: dict[str, str]) -> None:
    path = socket_path(env)
    path.parent.mkdir(mode=0o700, parents=True)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(str(path))
    os.chmod(path, 0o600)
    listener.listen(16)
    # A client that connects before the daemon exists waits in the backlog, as with systemd.
    early = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    early.connect(str(path))
    launcher = (
        "import os, sys\n"
        f"os.dup2({listener.fileno()}, 3)\n"
        "os.environ['LISTEN_FDS'] = '1'\n"
        "os.environ['LISTEN_PID'] = str(os.getpid())\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'clusterd'])\n"
    )
    process = subprocess.Popen([sys.executable, "-c", launcher], env=env,
                               pass_fds=(listener.fileno(),), stderr=subprocess.PIPE)
    listener.close()
    try:
        early.settimeout(30)
        from clusterctl import protocol

        early.sendall(protocol.encode_frame(protocol.hello("early")))
        decoder = protocol.FrameDecoder()
        while (reply := decoder.next_message()) is None:
            decoder.feed(early.recv(4096))
        assert reply["type"] == "hello"
        assert ping(env)["pid"] == process.pid  # exec kept the launcher's pid
        process.send_signal(signal.SIGTERM)
        assert process.wait(15) == 0
        # systemd owns the socket file: the daemon must leave it for the next activation.
        assert path.exists()
    finally:
        early.close()
        if process.poll() is None:
            process.kill()


def test_systemd_socket_activate_tool(env: dict[str, str]) -> None:
    tool = needs_tool("systemd-socket-activate", "systemd")
    path = socket_path(env)
    path.parent.mkdir(mode=0o700, parents=True)
    # The tool passes its children no environment but what -E names.
    passed = [f"-E{name}={env[name]}" for name in ("XDG_RUNTIME_DIR", "XDG_STATE_HOME",
                                                   "XDG_CONFIG_HOME", "HOME") if name in env]
    process = subprocess.Popen([tool, "-l", str(path), *passed, sys.executable, "-m",
                                "clusterd"], env=env, stderr=subprocess.PIPE)
    try:
        wait_for(path.exists, 10, "the activation socket")
        assert ping(env)["pid"] == process.pid
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(15)


def test_clusterctl_starts_the_daemon_once_even_when_raced(env: dict[str, str]) -> None:
    env = {k: v for k, v in env.items() if k != "CLUSTERD_NO_AUTOSTART"}
    racers = [subprocess.Popen([CLUSTERCTL, "status", "--json"], env=env,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
              for _ in range(4)]
    outputs = [r.communicate(timeout=60) for r in racers]
    for racer, (out, err) in zip(racers, outputs, strict=True):
        assert racer.returncode == 0, err
        assert out.strip() == "[]"
    assert any("Starting clusterd" in err for _, err in outputs)
    runtime_dir = Path(env["XDG_RUNTIME_DIR"])
    wait_for(lambda: len(daemons_of(runtime_dir)) == 1, 10, "the losing daemons to exit")
    first = ping(env)["pid"]
    again = subprocess.run([CLUSTERCTL, "status"], env=env, capture_output=True, text=True,
                           timeout=30)
    assert again.returncode == 0 and "Starting clusterd" not in again.stderr
    assert ping(env)["pid"] == first


@pytest.mark.parametrize("how", ["flag", "env"])
def test_autostart_can_be_turned_off(env: dict[str, str], how: str) -> None:
    args = [CLUSTERCTL, "--no-autostart", "status"] if how == "flag" else [CLUSTERCTL, "status"]
    run_env = dict(env)
    if how == "flag":
        run_env.pop("CLUSTERD_NO_AUTOSTART")
    result = subprocess.run(args, env=run_env, capture_output=True, text=True, timeout=30)
    assert result.returncode == 1
    assert "cannot reach clusterd" in result.stderr
    assert "hint:" in result.stderr
    assert daemons_of(Path(env["XDG_RUNTIME_DIR"])) == []


def test_sigterm_stops_quickly_and_removes_the_socket(env: dict[str, str]) -> None:
    root = Path(env["CLUSTERD_TEST_ROOT"])
    daemon = Daemon(root, env).start()
    assert daemon.process is not None
    started = time.monotonic()
    assert daemon.stop() == 0
    assert time.monotonic() - started < 10
    assert not daemon.socket.exists()
    assert not pid_alive(daemon.process.pid)


def test_sigterm_the_moment_the_socket_answers_is_a_clean_stop(env: dict[str, str]) -> None:
    """A client may signal the daemon as soon as it can connect: the handler is in place
    before the socket listens (it was not, for a few milliseconds: the default death, -15)."""
    root = Path(env["CLUSTERD_TEST_ROOT"])
    for _ in range(3):
        daemon = Daemon(root, env)
        process = subprocess.Popen([sys.executable, "-m", "clusterd"], env=env,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   start_new_session=True)
        daemon.process = process
        # No pause between tries: the signal must land in the first moment it may.
        wait_for(lambda d=daemon, p=process: connectable(d.socket) or p.poll() is not None,
                 30, "clusterd to listen", interval=0)
        assert daemon.stop() == 0
        assert not daemon.socket.exists()


def test_second_daemon_on_the_same_socket_steps_aside(env: dict[str, str]) -> None:
    root = Path(env["CLUSTERD_TEST_ROOT"])
    first = Daemon(root, env).start()
    try:
        second = subprocess.run([sys.executable, "-m", "clusterd"], env=env, capture_output=True,
                                text=True, timeout=30)
        assert second.returncode == 0
        assert "another clusterd" in second.stderr
        assert first.process is not None
        assert ping(env)["pid"] == first.process.pid
    finally:
        first.stop()


def test_client_reports_a_daemon_that_is_gone(env: dict[str, str]) -> None:
    with pytest.raises(ClusterdError) as error:
        ping(env)
    assert error.value.code == "DAEMON_UNAVAILABLE"


def test_cost_splits_final_while_the_daemon_was_down_are_settled_at_start(
        env: dict[str, str]) -> None:
    """A torn-down cluster's interval that closed two hours ago (no record, no kept copy:
    its split is final) is settled by the starting daemon, before any report asks."""
    import sqlite3

    root = Path(env["CLUSTERD_TEST_ROOT"])
    daemon = Daemon(root, env).start()  # makes the schema
    assert daemon.stop() == 0
    ended = time.time() - 2 * 3600
    db = sqlite3.connect(daemon.state_dir / "state.db")
    with db:
        db.execute(
            "INSERT INTO cost_intervals (cluster, incarnation, cloud_name, provider, infra,"
            " instance_type, nodes, kind, started_at, ended_at, node_price_per_hour,"
            " disk_price_per_hour, source, owner) VALUES"
            " ('gone', ?, 'gone-x', 'ssh', 'ssh/rack', NULL, 2, 'running', ?, ?, 1.5, 0, "
            "'pool price', NULL)", [ended - 3600, ended - 3600, ended])
    db.close()
    daemon = Daemon(root, env).start()
    try:
        wait_for(lambda: "cost splits settled" in daemon.log(), 30, "the settling at start")
        db = sqlite3.connect(daemon.state_dir / "state.db")
        try:
            rows = db.execute("SELECT cluster, total FROM cost_settled").fetchall()
        finally:
            db.close()
        assert rows == [("gone", pytest.approx(3.0))]  # 2 nodes, an hour, $1.5/h each
    finally:
        assert daemon.stop() == 0
