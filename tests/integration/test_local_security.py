"""Other users of this machine, as attackers of a user's clusterd: a planted runtime or state
directory, a socket served by someone else, a listener that is not a Unix socket. The daemon
refuses to start, and the client refuses to send anything, with the path and the fix."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support import (
    CLUSTERCTL,
    Daemon,
    OtherUser,
    make_env,
    other_user,
    short_tempdir,
    wait_for,
)

# The attacker's listener: plain system Python (it cannot read root's venv), recording every
# byte a client sends it.
# Records whatever any connection sends. Told to stop (its stdin closed), it first reads every
# connection still waiting to be accepted, then exits 0: once it has, the record holds all that
# clients which have exited sent (what they sent is in the socket before they exit).
LISTENER = textwrap.dedent("""
    import os, selectors, socket, sys
    record = open(sys.argv[2], "wb", buffering=0)
    if sys.argv[1].startswith("fd:"):
        server = socket.socket(fileno=int(sys.argv[1][3:]))
    else:
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(sys.argv[1])
        os.chmod(sys.argv[1], 0o777)
    server.listen(8)

    def take(conn):
        conn.settimeout(5)
        try:
            while data := conn.recv(65536):
                record.write(data)
        except OSError:
            pass
        conn.close()

    selector = selectors.DefaultSelector()
    selector.register(server, selectors.EVENT_READ)
    selector.register(sys.stdin, selectors.EVENT_READ)
    open(sys.argv[2] + ".ready", "w").close()
    while ready := {key.fileobj for key, _ in selector.select(timeout=30)}:
        if server in ready:
            take(server.accept()[0])
        else:  # stdin closed: stop, after the connections still in the backlog
            server.setblocking(False)
            while True:
                try:
                    conn = server.accept()[0]
                except BlockingIOError:
                    sys.exit(0)
                conn.setblocking(True)
                take(conn)
    sys.exit(1)  # no word to stop in 30 s
""")


@pytest.fixture
def attacker() -> Iterator[OtherUser]:
    with other_user("cdl") as user:
        yield user


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("cdsec-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def start_daemon(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "clusterd"], env=env, capture_output=True,
                          text=True, timeout=30)


def shared_runtime(root: Path) -> dict[str, str]:
    """An environment whose runtime dir's parent anyone may write to, as /tmp."""
    env = make_env(root)
    os.chmod(root, 0o755)
    Path(env["XDG_RUNTIME_DIR"]).chmod(0o1777)
    return env


def test_daemon_refuses_a_runtime_dir_planted_by_another_user(
        root: Path, attacker: OtherUser) -> None:
    env = shared_runtime(root)
    planted = Path(env["XDG_RUNTIME_DIR"]) / "clusterd"
    made = attacker.run(["mkdir", "-m", "0700", str(planted)])
    assert made.returncode == 0, made.stderr
    result = start_daemon(env)
    assert result.returncode == 1
    assert f"{planted} belongs to {attacker.name} (uid {attacker.uid})" in result.stderr
    assert "hint: have it removed" in result.stderr
    assert list(planted.iterdir()) == []  # nothing of ours went there


def test_daemon_refuses_symlinked_and_writable_state_dirs(root: Path) -> None:
    env = make_env(root)
    elsewhere = root / "elsewhere"
    elsewhere.mkdir(mode=0o700)
    state = Path(env["XDG_STATE_HOME"])
    state.mkdir()
    (state / "clusterd").symlink_to(elsewhere)
    result = start_daemon(env)
    assert result.returncode == 1
    assert f"{state / 'clusterd'} is a symbolic link" in result.stderr
    (state / "clusterd").unlink()
    (state / "clusterd").mkdir()
    (state / "clusterd").chmod(0o777)
    result = start_daemon(env)
    assert result.returncode == 1
    assert "has mode 0777" in result.stderr and "chmod 700" in result.stderr
    assert list(elsewhere.iterdir()) == [] and list((state / "clusterd").iterdir()) == []


def _serve_as(attacker: OtherUser, where: str, record: Path,
              listening: socket.socket | None = None) -> subprocess.Popen[bytes]:
    fds = () if listening is None else (listening.fileno(),)
    if listening is not None:
        where = f"fd:{listening.fileno()}"
    process = subprocess.Popen(
        ["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}", "--init-groups",
         "/usr/bin/python3", "-c", LISTENER, where, str(record)],
        pass_fds=fds, stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        env={"PATH": "/usr/bin:/bin"},
    )
    wait_for(lambda: Path(f"{record}.ready").exists() or process.poll() is not None, 15,
             "the attacker's listener")
    assert process.poll() is None, process.stderr.read() if process.stderr else ""
    return process


def _stop(process: subprocess.Popen[bytes]) -> None:
    """Stop the listener once it has recorded all that was sent to it."""
    assert process.stdin is not None
    process.stdin.close()
    try:
        process.wait(10)
    finally:
        process.kill()
        process.wait()


def test_client_sends_nothing_to_a_socket_in_a_planted_dir(
        root: Path, attacker: OtherUser) -> None:
    env = shared_runtime(root)
    planted = Path(env["XDG_RUNTIME_DIR"]) / "clusterd"
    assert attacker.run(["mkdir", "-m", "0755", str(planted)]).returncode == 0
    record = attacker.home / "got"
    listener = _serve_as(attacker, str(planted / "clusterd.sock"), record)
    try:
        env["API_KEY"] = "hunter2-planted"
        result = subprocess.run([CLUSTERCTL, "exec", "dev", "--secret", "API_KEY", "--",
                                 "true"], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 1
        assert f"{planted} belongs to {attacker.name}" in result.stderr
        assert "hint:" in result.stderr
    finally:
        _stop(listener)
    assert listener.returncode == 0  # it read every connection made to it: none sent a byte
    assert record.read_bytes() == b""


def test_client_checks_whom_it_talks_to_before_sending(root: Path, attacker: OtherUser
                                                       ) -> None:
    """The directory is ours and private, but the process listening is someone else's
    (SO_PEERCRED names the process that called listen)."""
    env = make_env(root)
    directory = Path(env["XDG_RUNTIME_DIR"]) / "clusterd"
    directory.mkdir(mode=0o700)
    path = directory / "clusterd.sock"
    bound = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    bound.bind(str(path))
    record = attacker.home / "got"
    try:
        listener = _serve_as(attacker, "", record, bound)
    finally:
        bound.close()
    try:
        env["API_KEY"] = "hunter2-peer"
        result = subprocess.run([CLUSTERCTL, "exec", "dev", "--secret", "API_KEY", "--",
                                 "true"], env=env, capture_output=True, text=True, timeout=30)
        assert result.returncode == 1
        assert f"is served by a process of uid {attacker.uid}" in result.stderr
    finally:
        _stop(listener)
    assert listener.returncode == 0  # it read every connection made to it: none sent a byte
    assert record.read_bytes() == b""


def test_socket_activation_refuses_a_tcp_listener(root: Path) -> None:
    env = make_env(root)
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(4)
    launcher = (
        "import os, sys\n"
        f"os.dup2({tcp.fileno()}, 3)\n"
        "os.environ['LISTEN_FDS'] = '1'\n"
        "os.environ['LISTEN_PID'] = str(os.getpid())\n"
        "os.execv(sys.executable, [sys.executable, '-m', 'clusterd'])\n"
    )
    try:
        result = subprocess.run([sys.executable, "-c", launcher], env=env,
                                pass_fds=(tcp.fileno(),), capture_output=True, text=True,
                                timeout=30)
    finally:
        tcp.close()
    assert result.returncode == 1
    assert "systemd passed a AF_INET/SOCK_STREAM socket" in result.stderr
    assert "only a Unix stream socket" in result.stderr


def test_everything_the_daemon_writes_is_private(root: Path) -> None:
    env = make_env(root)
    daemon = Daemon(root, env).start()
    try:
        assert daemon.ctl("status").returncode == 0
    finally:
        daemon.stop()
    for top in (daemon.state_dir, daemon.socket.parent):
        assert top.stat().st_mode & 0o777 == 0o700
        for path in top.rglob("*"):
            mode = path.lstat().st_mode & 0o777
            assert mode in ((0o700,) if path.is_dir() else (0o600,)), (path, oct(mode))
