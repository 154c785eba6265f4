"""One dashboard per daemon: a lock held while it runs, and a 0600 state file (pid, port, token)
beside the daemon's socket, so that a second `clusterctl dashboard` can ask the running one
for a new login link (with the token in a header: never on a command line, nor in a URL)."""

from __future__ import annotations

import contextlib
import fcntl
import http.client
import json
import os
import socket
import time
from typing import Any

STATE_NAME = "dashboard.json"
LOCK_NAME = "dashboard.lock"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # alive, but another user's: not our dashboard
        return False
    return True


def _answers(port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.settimeout(1.0)
        try:
            sock.connect(("127.0.0.1", port))
        except OSError:
            return False
    return True


class Instance:
    """The dashboard of the daemon whose socket lives in `directory`."""

    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.state_path = os.path.join(directory, STATE_NAME)
        self._lock_fd: int | None = None

    def acquire(self) -> bool:
        """Take the lock; False if another dashboard of this daemon holds it."""
        os.makedirs(self.directory, mode=0o700, exist_ok=True)
        fd = os.open(os.path.join(self.directory, LOCK_NAME),
                     os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def running(self, wait_s: float = 5.0) -> dict[str, Any] | None:
        """The state of the dashboard that holds the lock, once it has written it (it may be
        starting); None if there is none, or its pid is dead, or its port does not answer."""
        deadline = time.monotonic() + wait_s
        while True:
            state = self.read()
            if state is not None and _pid_alive(int(state.get("pid", 0))):
                return state if _answers(int(state.get("port", 0))) else None
            if time.monotonic() > deadline:
                return None
            time.sleep(0.1)

    def read(self) -> dict[str, Any] | None:
        try:
            with open(self.state_path) as f:
                state = json.load(f)
        except (OSError, ValueError):
            return None
        return state if isinstance(state, dict) else None

    def publish(self, port: int, token: str) -> None:
        """Write the state file (0600, atomically): only its owner may read the token."""
        temporary = f"{self.state_path}.{os.getpid()}"
        with contextlib.suppress(FileNotFoundError):  # left by a dashboard that died
            os.unlink(temporary)
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                     | os.O_CLOEXEC, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump({"pid": os.getpid(), "port": port, "token": token,
                       "started_at": time.time()}, f)
        os.replace(temporary, self.state_path)

    def login_link(self, state: dict[str, Any], timeout_s: float = 10.0
                   ) -> tuple[str, float] | None:
        """A new login URL from the running dashboard of `state`, and how many seconds it is
        good for; None if it gives none."""
        connection = http.client.HTTPConnection("127.0.0.1", int(state.get("port", 0)),
                                                timeout=timeout_s)
        try:
            connection.request("POST", "/api/login-code", headers={
                "Authorization": f"Bearer {state.get('token', '')}"})
            response = connection.getresponse()
            reply = json.loads(response.read(64 * 1024)) if response.status == 200 else {}
            return str(reply["url"]), float(reply["expires_in_s"])
        except (OSError, http.client.HTTPException, ValueError, LookupError, TypeError):
            return None
        finally:
            connection.close()

    def release(self) -> None:
        state = self.read()
        if state is not None and state.get("pid") == os.getpid():
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.state_path)
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
