"""Opening SQLite the one way the daemon and the agent both want it."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import aiosqlite


async def connect(path: Path, *, autocommit: bool = False) -> aiosqlite.Connection:
    """A connection in WAL mode with named rows. synchronous=NORMAL in WAL mode survives a
    killed process (only power loss can drop the last commits), which is the crash model.
    `autocommit`: each statement is its own transaction, for a store whose writes are all
    single statements: one trip to aiosqlite's thread a write instead of two."""
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    # SQLite makes the WAL and SHM files with the database file's mode: 0600 from the start
    # (and an older clusterd's 0644 database is tightened).
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        os.fchmod(fd, 0o600)
    finally:
        os.close(fd)
    for suffix in ("-wal", "-shm"):
        with contextlib.suppress(FileNotFoundError):
            os.chmod(f"{path}{suffix}", 0o600)
    conn = await (aiosqlite.connect(path, isolation_level=None) if autocommit
                  else aiosqlite.connect(path))
    conn.row_factory = aiosqlite.Row
    try:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA busy_timeout=5000")
    except BaseException:
        await conn.close()
        raise
    return conn
