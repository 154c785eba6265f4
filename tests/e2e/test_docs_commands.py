"""The documentation's commands run as written: every runnable command block of README.md and
docs/*.md (the convention: tests/doc_blocks.py, and for readers docs/testing.md), in order, one
document at a time, against a fresh daemon whose HOME and XDG directories are the test's own,
from the repository's directory, each block checked for its exit code.

README.md's blocks run where a newcomer runs them: after scripts/quickstart. The test runs the
quickstart's own `clusterctl` lines, read from scripts/quickstart (its install steps are what
made the venv this test runs in), so the `quickstart` cluster and its job 1 exist as they would.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.doc_blocks import REPO, Block, blocks, documents
from tests.support import Daemon, make_env, running, short_tempdir, wait_for

RUNNABLE = [path for path in documents() if any(b.skip_reason is None for b in blocks(path))]


def quickstart_steps() -> list[str]:
    """scripts/quickstart's clusterctl commands, in order."""
    script = (REPO / "scripts" / "quickstart").read_text()
    return [line.strip() for line in script.splitlines() if line.startswith("clusterctl ")]


@pytest.fixture
def private_daemon() -> Iterator[Daemon]:
    """A daemon, and the commands run beside it, with HOME and XDG directories of their own:
    nothing a document's commands write lands in the user's."""
    root = short_tempdir("cdd-")
    env = make_env(root)
    for name, directory in (("HOME", "home"), ("XDG_CACHE_HOME", "cache"),
                            ("XDG_DATA_HOME", "data")):
        (root / directory).mkdir(mode=0o700)
        env[name] = str(root / directory)
    with running(Daemon(root, env)) as daemon:
        try:
            yield daemon
        finally:
            finish_managed_jobs(daemon)


def finish_managed_jobs(daemon: Daemon) -> None:
    """Cancel what a document left running and wait until each job's cluster is gone (a
    managed job's cluster is the job's to tear down, not `down`'s)."""
    daemon.ctl("jobs", "cancel", "--all")

    def unfinished() -> list[dict[str, object]]:
        jobs: list[dict[str, object]] = json.loads(daemon.ctl("jobs", "queue", "--json").stdout)
        return jobs
    wait_for(lambda: not unfinished(), 120, "managed jobs to finish")
    wait_for(lambda: not [c for c in daemon.status() if str(c["name"]).startswith("mj-")], 120,
             "managed jobs' clusters to go")


def run(daemon: Daemon, script: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-e", "-o", "pipefail", "-c", script], cwd=REPO,
                          env=daemon.env, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=600)


def explain(daemon: Daemon, block: Block | str, result: subprocess.CompletedProcess[str]) -> str:
    where = block.where if isinstance(block, Block) else "scripts/quickstart"
    return (f"{where}: exit {result.returncode}\n--- stdout\n{result.stdout[-3000:]}\n"
            f"--- stderr\n{result.stderr[-3000:]}\n--- daemon log\n{daemon.log()[-3000:]}")


def test_quickstart_makes_the_cluster_readme_uses() -> None:
    assert "clusterctl launch -c quickstart docs/examples/hello.yaml" in quickstart_steps()
    assert Path("README.md") in [p.relative_to(REPO) for p in RUNNABLE]


@pytest.mark.timeout(900)
@pytest.mark.parametrize("path", RUNNABLE, ids=lambda p: str(p.relative_to(REPO)))
def test_document_commands_run_as_written(private_daemon: Daemon, path: Path) -> None:
    if path.name == "README.md":
        for step in quickstart_steps():
            result = run(private_daemon, step)
            assert result.returncode == 0, explain(private_daemon, step, result)
    ran = 0
    for block in blocks(path):
        if block.skip_reason is not None:
            continue
        result = run(private_daemon, block.script)
        assert result.returncode == block.expected_exit, explain(private_daemon, block, result)
        ran += 1
    assert ran
