"""Fixtures shared by the integration and end-to-end tests (helpers live in support.py)."""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.k8sbed import TESTBED
from tests.support import Daemon, running_daemon
from tests.work_units import BedGroupScheduling


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


# Where the suite's time goes, by module (setup, call and teardown, module fixtures included):
# --durations names the slowest tests, not the modules whose beds and fixtures cost most.
_module_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    module = report.nodeid.split("::", 1)[0]
    _module_seconds[module] = _module_seconds.get(module, 0.0) + report.duration


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    if len(_module_seconds) < 2:
        return
    # Two to a line, forty in all: CI shows only the end of the output.
    slowest = sorted(_module_seconds.items(), key=lambda kv: -kv[1])[:40]
    terminalreporter.section("slowest modules")
    cells = [f"{seconds:7.1f}s {module.removeprefix('tests/')}" for module, seconds in slowest]
    for left in range(0, len(cells), 2):
        terminalreporter.write_line("  ".join(f"{c:<58}" for c in cells[left:left + 2]).rstrip())
    terminalreporter.write_line(f"{sum(_module_seconds.values()):8.1f}s in all")


def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> BedGroupScheduling:
    """scripts/test's workers take whole modules, and a shared bed's modules together."""
    return BedGroupScheduling(config, log)


# What a marker's tests need built before the first test: (the command, what it builds).
PREPARED = (
    ("k8s", ["k8s", "build", "--runtime-image"], "the Kubernetes test bed"),
    ("ec2_images", ["ec2", "build-images"], "the EC2 test bed's image roots"),
)


def pytest_collection_finish(session: pytest.Session) -> None:
    """The Kubernetes bed's first build on a machine takes minutes, the EC2 bed's image roots
    a few (then they are cached outside the repo): done here, before the first test, so that
    no test's timeout has to cover them. A failure is left for the bed's fixture to report."""
    if session.config.option.collectonly or os.getuid() != 0 or not shutil.which("ip"):
        return
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    # Side by side: the Kubernetes build is mostly compiling, the image roots mostly
    # downloading and unpacking packages. Output goes to files, not pipes: neither build
    # waits on a reader busy with the other.
    with contextlib.ExitStack() as stack:
        started = []
        for marker, command, what in PREPARED:
            if not any(item.get_closest_marker(marker) for item in session.items):
                continue
            if reporter is not None:
                reporter.write_line(f"building {what}, or finding it in the cache (the first "
                                    "time on a machine: minutes)")
            output = stack.enter_context(tempfile.TemporaryFile("w+"))
            started.append((subprocess.Popen([sys.executable, TESTBED, *command],
                                             stdout=output, stderr=subprocess.STDOUT), output))
        for build, output in started:
            try:
                build.wait(timeout=3600)
            except subprocess.TimeoutExpired:
                build.kill()
                build.wait()
                continue
            output.seek(0)
            lines = output.read().strip().splitlines()
            if reporter is not None and lines:
                reporter.write_line(lines[-1])
