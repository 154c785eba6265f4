"""The node helper's processes: started in sessions of their own (so they outlive the
command that started them), recorded in pid files with their start times (so a recycled pid
is never taken for ours), and waited for until they serve."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO

import psutil

from clusterd.agent.helper_error import HelperError
from clusterd.agent.processes import find


def read_pidfile(path: Path) -> psutil.Process | None:
    try:
        record = json.loads(path.read_text())
        return find(int(record["pid"]), float(record["create_time"]))
    except (OSError, ValueError, KeyError):
        return None


def head_address(process: psutil.Process) -> str | None:
    """`IP:PORT` a running `ray start --head` serves its GCS on, from its own command line
    (what it really listens on, whatever a record says); None for a worker or unknown."""
    try:
        argv = process.cmdline()
    except psutil.Error:
        return None
    if "--head" not in argv:
        return None
    flags = dict(arg.split("=", 1) for arg in argv if arg.startswith("--") and "=" in arg)
    ip, port = flags.get("--node-ip-address"), flags.get("--port")
    return f"{ip}:{port}" if ip and port else None


def write_pidfile(path: Path, pid: int) -> None:
    record = {"pid": pid, "create_time": psutil.Process(pid).create_time()}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record))
    tmp.replace(path)


def tail(path: Path, lines: int = 25) -> str:
    try:
        text = path.read_text(errors="replace")
    except OSError:
        return ""
    return "\n".join(text.rstrip().splitlines()[-lines:])


def home_expanded(env: dict[str, str]) -> dict[str, str]:
    """The environment asked for, with `~` expanded: the daemon names paths in the node's home
    without knowing where that is."""
    return {key: os.path.expanduser(value) if value.startswith("~") else value
            for key, value in env.items()}


def spawn(argv: list[str], log_path: Path, env: dict[str, str] | None = None,
           stdin: bytes | None = None, held: list[IO[bytes]] | None = None) -> int:
    """Start a process in a session of its own; `stdin` is written to it (then closed), so a
    secret it needs never shows in its argv or environment. With `held`, its stdin is a pipe
    left open, appended there, for the caller to write to later."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL if stdin is None and held is None else subprocess.PIPE,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
            close_fds=True,
            env={**os.environ, **(env or {})},
        )
    if process.stdin is not None and held is not None:
        held.append(process.stdin)
    elif process.stdin is not None:
        # A process that dies at once is reported by whoever waits for it to be ready.
        with contextlib.suppress(BrokenPipeError), process.stdin:
            process.stdin.write(stdin or b"")
    return process.pid


def spawn_recorded(argv: list[str], log_path: Path, pid_path: Path,
                    env: dict[str, str] | None = None, stdin: bytes | None = None,
                    held: list[IO[bytes]] | None = None) -> int:
    """`spawn`, then its pid file, with SIGTERM held off in between: the daemon calling this
    command off (it signals the command's process group) must not leave a process of ours
    running that no pid file names, so nothing could stop it. The started process has a
    session of its own, so the signal never reaches it."""
    caught: list[int] = []
    previous = signal.signal(signal.SIGTERM, lambda signum, _frame: caught.append(signum))
    try:
        pid = spawn(argv, log_path, env, stdin, held)
        write_pidfile(pid_path, pid)
    finally:
        signal.signal(signal.SIGTERM, previous)
    if caught:
        signal.raise_signal(signal.SIGTERM)
    return pid


def wait_ready(
    pid_path: Path, log_path: Path, what: str, ready: Callable[[], bool], timeout_s: float
) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if read_pidfile(pid_path) is None:
            raise HelperError(f"{what} exited while starting:\n{tail(log_path)}")
        if ready():
            return
        time.sleep(0.1)
    raise HelperError(f"{what} did not become ready within {timeout_s:.0f} s:\n{tail(log_path)}")


def described(failure: OSError) -> str:
    if isinstance(failure, TimeoutError):
        return "connection timed out"
    return failure.strerror or str(failure)


def connect_failure(address: str, timeout_s: float = 1.0) -> OSError | None:
    """Why address takes no connection now (None: it does)."""
    try:
        if address.startswith("unix:"):
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
                sock.settimeout(timeout_s)
                sock.connect(address.removeprefix("unix:"))
        else:
            host, port = address.rsplit(":", 1)
            with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout_s):
                pass
        return None
    except OSError as exc:
        return exc


def connectable(address: str) -> bool:
    return connect_failure(address) is None


def wait_for_head(address: str, node_ip: str, reach_s: float, timeout_s: float) -> None:
    """Until the head's port at `address` takes connections. A refused connection is a head
    whose host answers, its Ray still starting: waited for up to timeout_s. Silence (a
    firewall dropping the packets) for reach_s is said at once, with what to do: Ray would
    wait out its whole timeout and then say only that it failed."""
    started = silent_since = time.monotonic()
    while (failure := connect_failure(address, timeout_s=1.0)) is not None:
        now = time.monotonic()
        if isinstance(failure, ConnectionRefusedError):
            silent_since = now
        elif now - silent_since > reach_s:
            raise HelperError(
                f"this node ({node_ip}) cannot reach the Ray head at {address}: "
                f"{described(failure)}. The nodes of a cluster must reach each other on "
                f"every port: a firewall or security group between them blocks Ray (on AWS, "
                f"the cluster's security group must let its own members in)")
        if now - started > timeout_s:
            raise HelperError(f"the Ray head at {address} did not open its port within "
                              f"{timeout_s:.0f} s")
        time.sleep(0.05)
