"""Shared fixtures for the fast unit tests (no network, no Ray, no daemons)."""

from __future__ import annotations

import pytest


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"
