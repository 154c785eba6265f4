"""`clusterctl history [CLUSTER]`: clusters that were torn down, newest first, with their jobs
and what was kept of their logs (read them with `clusterctl logs CLUSTER JOB`). Imported only
when that verb runs."""

from __future__ import annotations

import sys

from clusterctl import _exit_codes, protocol
from clusterctl._render import age, table
from clusterctl._task_options import print_json
from clusterctl.client import Client

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    import argparse
    from typing import Any


def add_options(history: argparse.ArgumentParser) -> None:
    history.add_argument("cluster", nargs="?", default="",
                         help="only this cluster's (then its jobs are listed too)")
    history.add_argument("--limit", type=int, default=100, metavar="N",
                         help="at most N clusters (default 100)")
    history.add_argument("--json", action="store_true")


def kept_state(job: dict[str, Any]) -> str:
    if job.get("dropped"):
        return "dropped"
    if job.get("complete"):
        return "complete"
    return "partial (cut)" if job.get("cut") else "partial"


def main(client: Client, args: argparse.Namespace) -> int:
    result = client.call(protocol.HistoryArgs(cluster=args.cluster, limit=args.limit))
    clusters = result.get("clusters", [])
    if args.json:
        print_json(clusters)
        return _exit_codes.SUCCEEDED
    if not clusters:
        which = f"cluster {args.cluster} was" if args.cluster else "clusters were"
        sys.stderr.write(f"No {which} torn down (that this daemon kept).\n")
        return _exit_codes.NOT_FOUND if args.cluster else _exit_codes.SUCCEEDED
    rows = [[c["name"], c["infra"], age(c.get("launched_at") or c.get("created_at")),
             age(c.get("torn_down_at")), str(len(c["jobs"])), c.get("reason") or "-"]
            for c in clusters]
    sys.stdout.write(table(["NAME", "INFRA", "LAUNCHED", "TORN DOWN", "JOBS", "REASON"], rows))
    if args.cluster:
        for cluster in clusters:
            jobs = cluster["jobs"]
            if not jobs:
                continue
            sys.stdout.write(f"\nJobs of {cluster['name']} (torn down "
                             f"{age(cluster.get('torn_down_at'))}):\n")
            sys.stdout.write(table(
                ["ID", "NAME", "SUBMITTED", "STATUS", "KEPT LOG"],
                [[str(j["job_id"]), j.get("name") or "-", age(j.get("submitted_at")),
                  j["status"], kept_state(j)] for j in jobs]))
    return _exit_codes.SUCCEEDED
