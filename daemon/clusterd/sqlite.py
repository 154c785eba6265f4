"""Opening SQLite the one way the daemon and the agent both want it."""

from __future__ import annotations

from pathlib import Path

import aiosqlite


async def connect(path: Path) -> aiosqlite.Connection:
    """A connection in WAL mode with named rows. synchronous=NORMAL in WAL mode survives a
    killed process (only power loss can drop the last commits), which is the crash model."""
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = await aiosqlite.connect(path)
    conn.row_factory = aiosqlite.Row
    try:
        await conn.execute("PRAGMA journal_mode=WAL")
        await conn.execute("PRAGMA synchronous=NORMAL")
        await conn.execute("PRAGMA busy_timeout=5000")
    except BaseException:
        await conn.close()
        raise
    return conn
