"""Managed jobs never touch what they did not make, and secrets are never at rest, end to end
on the `local` provider (no test bed): a real daemon, Ray and agent, through clusterctl.

- A user's cluster named as a job's would be (`mj-ID-NAME`) is never the job's: the job gets
  a name of its own, and the user's cluster and its running job are left as they were.
- A user's `launch` onto an unfinished job's cluster name is refused, naming the job.
- `--secret` values and URL credentials (in `--env` values and in commands) reach the job and
  no file clusterd or clusterctl writes: state DB (and its WAL), logs, argv cache, request
  records."""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support import Daemon, make_env, short_tempdir, wait_for

pytestmark = [pytest.mark.ray, pytest.mark.timeout(600)]

SECRET = "s3cret-4f1d9"
TOKEN = "tok-8e2a7c"
REPO = f"https://bob:{TOKEN}@git.example.com/r.git"
# Where a daemon and clusterctl write: every file under these is searched.
XDG_DIRS = ("XDG_STATE_HOME", "XDG_CONFIG_HOME", "XDG_CACHE_HOME", "XDG_RUNTIME_DIR")


@contextlib.contextmanager
def daemon_with_all_dirs(prefix: str) -> Iterator[Daemon]:
    """A daemon whose every XDG dir (the cache too: clusterctl's argv cache) is the test's;
    its managed jobs all ended and its clusters down when done."""
    root = short_tempdir(prefix)
    daemon = Daemon(root, {**make_env(root), "XDG_CACHE_HOME": str(root / "cache")}).start()
    try:
        yield daemon
    finally:
        try:
            daemon.ctl("jobs", "cancel", "--all")
            wait_for(lambda: not queue(daemon), 120, "every managed job to end", interval=0.5)
            daemon.down_all()
        finally:
            daemon.stop()
            shutil.rmtree(root, ignore_errors=True)


def queue(daemon: Daemon, *extra: str) -> list[dict[str, Any]]:
    result = daemon.ctl("jobs", "queue", "--json", *extra)
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def submit(daemon: Daemon, *words: str) -> int:
    launched = daemon.ctl("jobs", "launch", "-d", "--infra", "local", *words)
    assert launched.returncode == 0, launched.stderr + daemon.log()[-4000:]
    found = re.search(r"Managed job (\d+) submitted", launched.stderr)
    assert found, launched.stderr
    return int(found.group(1))


def ended(daemon: Daemon, job_id: int, timeout: float = 300) -> dict[str, Any]:
    def final() -> dict[str, Any] | None:
        job = next(j for j in queue(daemon, "--all") if j["job_id"] == job_id)
        return job if job["status"] not in (
            "PENDING", "STARTING", "RUNNING", "RECOVERING", "CANCELLING") else None

    found: dict[str, Any] = wait_for(final, timeout, f"managed job {job_id} to end",
                                     interval=0.5)
    return found


def cluster_jobs(daemon: Daemon, cluster: str) -> list[dict[str, Any]]:
    result = daemon.ctl("queue", cluster, "--json")
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def test_a_job_never_takes_a_users_cluster_of_its_name(tmp_path: Path) -> None:
    with daemon_with_all_dirs("cdmo-") as daemon:
        # The first job's id is 1: its cluster would be mj-1-clash. The user has one.
        mine = daemon.ctl("launch", "-d", "-c", "mj-1-clash", "--", "sleep 600")
        assert mine.returncode == 0, mine.stderr + daemon.log()[-4000:]
        wait_for(lambda: any(j["status"] == "RUNNING"
                             for j in cluster_jobs(daemon, "mj-1-clash")),
                 120, "the user's job to run")
        job_id = submit(daemon, "--name", "clash", "--", "echo from the job")
        assert job_id == 1
        job = ended(daemon, job_id)
        assert job["status"] == "SUCCEEDED", job
        assert job["cluster"] == "mj-1-clash-2", job
        # The user's cluster is as it was: UP, its job still running, never cancelled.
        users = daemon.cluster("mj-1-clash")
        assert users is not None and users["status"] == "UP", users
        assert [j["status"] for j in cluster_jobs(daemon, "mj-1-clash")] == ["RUNNING"]
        assert daemon.cluster("mj-1-clash-2") is None  # the job's own went with it

        # An unfinished job's cluster name is not the user's to launch, made yet or not.
        go = tmp_path / "go"
        held = submit(daemon, "--name", "held", "--",
                      f"while [ ! -e {go} ]; do sleep 0.2; done")
        refused = daemon.ctl("launch", "-c", f"mj-{held}-held", "--", "true")
        assert refused.returncode != 0
        assert f"belongs to managed job {held}" in refused.stderr, refused.stderr
        go.touch()
        assert ended(daemon, held)["status"] == "SUCCEEDED"
        users = daemon.cluster("mj-1-clash")
        assert users is not None and users["status"] == "UP", users


def files_under(daemon: Daemon) -> list[Path]:
    return [p for name in XDG_DIRS for p in Path(daemon.env[name]).rglob("*") if p.is_file()]


def test_secrets_and_url_credentials_reach_the_job_and_no_file(tmp_path: Path) -> None:
    """The job writes a hash of what it got to a file outside clusterd's dirs; then every file
    clusterd and clusterctl wrote is searched for the values."""
    seen = hashlib.sha256(f"{SECRET} {REPO}\n".encode()).hexdigest()
    given = ["--secret", f"K={SECRET}", "--env", f"REPO={REPO}"]

    def hashing_to(out: Path) -> str:
        # The command carries the URL's credentials too (as a `git clone URL` would).
        return f'test "$REPO" = "{REPO}" && echo "$K $REPO" | sha256sum > {out}'

    with daemon_with_all_dirs("cdms-") as daemon:
        launched = daemon.ctl("launch", "-c", "sec", *given, "--", hashing_to(tmp_path / "a"))
        assert launched.returncode == 0, launched.stderr + daemon.log()[-4000:]
        ran = daemon.ctl("exec", "sec", *given, "--", hashing_to(tmp_path / "b"))
        assert ran.returncode == 0, ran.stderr
        job_id = submit(daemon, *given, "--", hashing_to(tmp_path / "c"))
        assert ended(daemon, job_id)["status"] == "SUCCEEDED"
        for out in "abc":
            assert (tmp_path / out).read_text().split()[0] == seen, out
        requests = daemon.ctl("requests", "--all", "--json")
        assert requests.returncode == 0 and "REPO" in requests.stdout, requests.stderr
        outputs = [daemon.ctl(*words) for words in (
            ("jobs", "queue", "--all", "--json"), ("events", "sec"),
            ("jobs", "logs", "--controller", "--no-follow", str(job_id)))]
        assert all(o.returncode == 0 for o in outputs), [o.stderr for o in outputs]
        leaks = {str(p): value for p in files_under(daemon)
                 for value in (SECRET, TOKEN) if value.encode() in p.read_bytes()}
        shown = [(o.args, v) for o in [requests, *outputs] for v in (SECRET, TOKEN)
                 if v in o.stdout + o.stderr]
        assert not leaks and not shown, (leaks, shown)
