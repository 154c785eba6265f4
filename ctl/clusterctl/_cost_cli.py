"""`clusterctl cost-report [--days N] [--limit N] [--cluster NAME] [--json]`: what clusters
(torn-down ones too) and managed jobs cost, split over jobs, setup, idle and stopped disks;
per provider and per day; totals. Imported only when that verb runs."""

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


def add_options(report: argparse.ArgumentParser) -> None:
    report.add_argument("--days", type=int, default=30, metavar="N",
                        help="the last N days (default 30)")
    report.add_argument("--limit", type=int, default=100, metavar="N",
                        help="list the N costliest clusters (default 100; 0: every one); "
                        "the totals are over all")
    report.add_argument("--cluster", default="", metavar="NAME",
                        help="list this cluster's incarnations alone (the totals are over all)")
    report.add_argument("--json", action="store_true")


def dollars(value: float | None) -> str:
    if value is None:
        return "-"
    return f"${value:.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"


def _jobs_text(split: dict[str, Any]) -> str:
    return dollars(sum(j["cost"] for j in split["jobs"]))


def main(client: Client, args: argparse.Namespace) -> int:
    report = client.call(protocol.CostReportArgs(days=args.days, limit=args.limit,
                                                  cluster=args.cluster))
    if args.json:
        print_json(report)
        return _exit_codes.SUCCEEDED
    out = sys.stdout
    clusters = report["clusters"]
    if not clusters:
        if args.cluster:
            out.write(f"Cluster {args.cluster} did not run in the last {args.days} days: $0."
                      "\n")
        else:
            out.write(f"Nothing ran in the last {args.days} days: $0.\n")
        return _exit_codes.SUCCEEDED
    out.write(table(
        ["NAME", "INFRA", "NODES", "STARTED", "ENDED", "$/H", "COST", "JOBS", "SETUP", "IDLE",
         "STOPPED"],
        [[c["name"], c["infra"], str(c["nodes"]), age(c["started_at"]),
          "running" if c["live"] else age(c["ended_at"]), dollars(c["per_hour"]),
          dollars(c["cost"]), _jobs_text(c["split"]), dollars(c["split"]["provisioning"]),
          dollars(c["split"]["idle"]), dollars(c["split"]["stopped"])] for c in clusters]))
    others = report.get("others") or {}  # a daemon from before `limit` lists every one
    if others.get("clusters") and not args.cluster:
        out.write(f"... and {others['clusters']} more clusters ({dollars(others['cost'])});"
                  " --limit 0 lists every one\n")
    if report["managed_jobs"]:
        out.write("\nManaged jobs:\n")
        out.write(table(["ID", "NAME", "ATTEMPTS", "COST", "RECOVERIES COST"],
                        [[str(j["job_id"]), j["name"] or "-", str(j["attempts"]),
                          dollars(j["cost"]), dollars(j["recoveries"])]
                         for j in report["managed_jobs"]]))
    out.write("\nPer provider: " + ", ".join(f"{p['provider']} {dollars(p['cost'])}"
                                             for p in report["providers"]) + "\n")
    out.write("Per day: " + ", ".join(f"{d['day']} {dollars(d['cost'])}"
                                      for d in report["days"]) + "\n")
    split = report["split"]
    out.write(f"Total: {dollars(report['total'])} (jobs {_jobs_text(split)}, setup "
              f"{dollars(split['provisioning'])}, idle {dollars(split['idle'])}, stopped "
              f"disks {dollars(split['stopped'])}); now {dollars(report['burn_rate'])}/h\n")
    return _exit_codes.SUCCEEDED
