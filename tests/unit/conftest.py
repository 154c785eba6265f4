"""Fixtures the unit tests share."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from clusterd.state.db import Database


@pytest.fixture
async def db(tmp_path: Path) -> AsyncIterator[Database]:
    """A state database, migrated, in a temporary directory."""
    database = Database(tmp_path / "state.db")
    await database.open()
    try:
        yield database
    finally:
        await database.close()
