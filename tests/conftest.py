"""Fixtures shared by the integration and end-to-end tests (helpers live in support.py)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support import Daemon, running_daemon


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with running_daemon() as d:
        yield d


@pytest.fixture(scope="session")
def shared_daemon() -> Iterator[Daemon]:
    """One daemon for the tests that only need a daemon and an UP local cluster."""
    with running_daemon("cds-") as d:
        yield d


@pytest.fixture(scope="session")
def local_cluster(shared_daemon: Daemon) -> str:
    result = shared_daemon.ctl("launch", "-c", "shared", "--", "echo ready")
    assert result.returncode == 0, result.stderr + shared_daemon.log()[-4000:]
    return "shared"
