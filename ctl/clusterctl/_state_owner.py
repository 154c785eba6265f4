"""Which clusterd serves a state directory.

One daemon per state directory: two daemons on one `state.db` would both run refresh,
autostop and managed-job controllers on the same clusters (two controllers of one managed job
could launch two clusters for it). The daemon holds an exclusive flock on
`STATE/daemon.lock` for its whole life, and writes its pid and socket there, so a second
daemon for the same state (started with another socket, or from a login session with another
XDG_RUNTIME_DIR) can name the one that runs, and so can a clusterctl whose autostart failed.

The lock lives with the state, not with the socket: the socket's directory varies with the
session, the state does not. Standard library only: clusterctl reads it on a failed
autostart.
"""

from __future__ import annotations

import dataclasses
import json
import os

LOCK_NAME = "daemon.lock"


@dataclasses.dataclass(frozen=True)
class StateOwner:
    pid: int
    socket: str


def lock_path(state_dir: str) -> str:
    return os.path.join(state_dir, LOCK_NAME)


def encode(owner: StateOwner) -> bytes:
    return json.dumps({"pid": owner.pid, "socket": owner.socket}).encode()


def decode(data: bytes) -> StateOwner | None:
    try:
        found = json.loads(data)
        return StateOwner(int(found["pid"]), str(found["socket"]))
    except (ValueError, TypeError, KeyError):
        return None  # empty (being written), or not ours


def read_owner(state_dir: str) -> StateOwner | None:
    """The daemon that serves `state_dir` now, if one does (its pid is alive). Reads only:
    taking the lock to test it could make a starting daemon fail."""
    try:
        fd = os.open(lock_path(state_dir), os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        if os.fstat(fd).st_uid != os.getuid():
            return None
        owner = decode(os.read(fd, 4096))
    finally:
        os.close(fd)
    if owner is None:
        return None
    try:
        os.kill(owner.pid, 0)
    except ProcessLookupError:
        return None
    except PermissionError:
        pass  # alive, and not ours to signal: still the holder it says
    return owner
