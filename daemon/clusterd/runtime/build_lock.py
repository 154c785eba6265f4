"""One build of a wheelhouse at a time among every daemon sharing its directory.

Several daemons (a user's second state dir, another user with a shared
CLUSTERD_WHEELHOUSE_DIR, the test suite's workers) may want the same wheelhouse at once. The
rename into place already keeps a half-built one from being seen; the lock keeps the second
daemon from fetching and building everything again meanwhile: it waits, then finds the first
one's. Blocking: call it from a thread.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Iterator
from pathlib import Path

from clusterctl.protocol import ErrorCode, ProtocolError

# Longer than any build we have seen (a cold index fetch of ray's wheels on a slow link).
BUILD_WAIT_S = 1800.0
POLL_S = 0.25


@contextlib.contextmanager
def one_builder(root: Path, key: str, *, wait_s: float = BUILD_WAIT_S) -> Iterator[None]:
    """Hold the build lock of `key` under `root`; waits up to `wait_s` for another builder."""
    path = root / f".{key}.lock"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        deadline = time.monotonic() + wait_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise ProtocolError(
                        ErrorCode.PROVIDER_ERROR,
                        f"another process has been building the runtime's wheelhouse {key} "
                        f"for over {wait_s:.0f} s (it holds {path})",
                        "see which process holds it (fuser -v " + str(path) + "); stop it "
                        "if it is stuck, then launch again") from None
                time.sleep(POLL_S)
        yield
    finally:
        os.close(fd)  # releases the lock
