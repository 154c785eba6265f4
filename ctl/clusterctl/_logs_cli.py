"""`logs --status` and `logs --sync-down` (SkyPilot's `sky logs --status` and `--sync-down`):
a job's status as the exit code, and jobs' logs copied to this machine. Imported only when
`logs` is given one of them."""

from __future__ import annotations

import os
import sys

from clusterctl import _exit_codes, protocol
from clusterctl._fail import fail, report, worse
from clusterctl._private import PRIVATE_FILE_MODE
from clusterctl.client import Client, ClusterdError

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from typing import Any, BinaryIO

LOG_NAME = "run.log"  # as the agent names it on the head


def status(client: Client, args: argparse.Namespace) -> int:
    """Print the job's status (the latest job's, if none given); exit with its code: 0
    succeeded, 100 failed, 101 not finished, 103 cancelled, 102 no such job."""
    jobs = client.call(protocol.QueueArgs(cluster=args.cluster)).get("jobs", [])
    job = pick_job(jobs, args.job_id, args.cluster)
    print(f"Job {job['job_id']} on {args.cluster}: {job['status']}")
    return int(protocol.exit_code_for_job(job["status"]))


def pick_job(jobs: list[dict[str, Any]], job_id: int | None, cluster: str) -> dict[str, Any]:
    """The job of that id, or the latest; none: exit 102."""
    if job_id is None:
        if jobs:
            return max(jobs, key=lambda j: int(j["job_id"]))
        fail(f"cluster {cluster} has no jobs yet", f"run one: clusterctl exec {cluster} -- CMD",
             _exit_codes.NOT_FOUND)
    found = next((j for j in jobs if j["job_id"] == job_id), None)
    if found is None:
        fail(f"cluster {cluster} has no job {job_id}", f"see `clusterctl queue {cluster}`",
             _exit_codes.NOT_FOUND)
    return found


def default_dir(cluster: str) -> str:
    return os.path.join(os.path.expanduser("~"), "clusterd_logs", cluster)


def sync_down(client: Client, args: argparse.Namespace) -> int:
    """Each job's log as it is now (the latest job's, if none given) into DIR/JOB/run.log,
    every job's stream at once; a job still running is copied as far as it has got."""
    job_ids: list[int | None] = list(args.job_ids) or [None]
    base = os.path.abspath(args.sync_dir) if args.sync_dir else default_dir(args.cluster)
    files: list[BinaryIO | None] = [None] * len(job_ids)
    paths: list[str | None] = [None] * len(job_ids)

    def on_event(index: int, event: str, data: dict[str, Any]) -> None:
        if event != "log" or not data.get("data"):
            return
        out = files[index]
        if out is None:  # the first chunk names the job (the latest's id is not known before)
            paths[index] = _log_path(base, int(data["job_id"]))
            out = files[index] = _open_private(str(paths[index]))
        out.write(data["data"])

    requests = [protocol.LogsArgs(cluster=args.cluster, job_id=j, follow=False)
                for j in job_ids]
    try:
        results = client.call_many(requests, on_event=on_event)
    finally:
        for out in files:
            if out is not None:
                out.close()
    code: int = _exit_codes.SUCCEEDED
    for index, result in enumerate(results):
        shown = f"job {job_ids[index]}" if job_ids[index] is not None else "the latest job"
        if isinstance(result, ClusterdError):
            code = worse(code, report(f"{args.cluster} {shown}", result))
            continue
        job_id = int(result["job_id"])
        path = paths[index] or _empty_log(base, job_id)
        state = "" if result.get("exit_code") != _exit_codes.NOT_FINISHED else \
            f" ({result.get('status')}: what it has written so far)"
        print(f"Job {job_id} on {args.cluster}: log copied to {path}{state}")
    if code == _exit_codes.SUCCEEDED:
        sys.stderr.write(f"Logs are in {base}\n")
    return code


def _log_path(base: str, job_id: int) -> str:
    directory = os.path.join(base, str(job_id))
    os.makedirs(directory, mode=0o700, exist_ok=True)
    return os.path.join(directory, LOG_NAME)


def _open_private(path: str) -> BinaryIO:
    """The copy, replaced whole, readable by its owner only (a log may hold anything the job
    printed, as every file clusterd writes)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    os.fchmod(fd, PRIVATE_FILE_MODE)
    return os.fdopen(fd, "wb")


def _empty_log(base: str, job_id: int) -> str:
    """A job that has printed nothing yet: an empty file, so the copy is there all the same."""
    path = _log_path(base, job_id)
    _open_private(path).close()
    return path
