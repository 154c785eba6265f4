"""`clusterctl jobs ...`: managed jobs (a cluster of their own, recovered when it is lost,
torn down when they end). Imported only when that verb runs."""

from __future__ import annotations

import json
import sys
import time
from typing import TYPE_CHECKING, Any

from clusterctl import _exit_codes, protocol
from clusterctl._fail import fail
from clusterctl._render import Printer, age, table
from clusterctl._task_options import add_task_options, print_json, task_args
from clusterctl.client import Client

if TYPE_CHECKING:
    import argparse


def add_options(jobs: argparse.ArgumentParser) -> None:
    actions = jobs.add_subparsers(dest="jobs_action", metavar="ACTION")
    actions.required = True
    launch = actions.add_parser("launch", help="run a task as a managed job")
    launch.add_argument("-n", dest="job_name", metavar="NAME", help="the job's name")
    launch.add_argument("--infra", help="where it may run: aws, aws/REGION, aws/REGION/ZONE")
    add_task_options(launch)
    queue = actions.add_parser("queue", help="show managed jobs (newest first)")
    finished = queue.add_mutually_exclusive_group()
    finished.add_argument("--all", action="store_true", help="finished jobs too")
    finished.add_argument("-s", "--skip-finished", action="store_true",
                          help="unfinished jobs only (the default, unless --since or "
                               "--until is given)")
    queue.add_argument("--since", metavar="WHEN",
                       help="jobs submitted since WHEN: a time ago (30m, 2h, 3d, 1w) or a "
                            "local date and time (2026-12-06, '2026-12-06 14:00'); finished "
                            "ones too, unless -s")
    queue.add_argument("--until", metavar="WHEN", help="jobs submitted before WHEN (as --since)")
    queue.add_argument("--json", action="store_true")
    logs = actions.add_parser("logs", help="a managed job's log, across its attempts")
    logs.add_argument("job_id", type=int, nargs="?",
                      help="the managed job (default: the newest)")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and exit")
    logs.add_argument("--tail", type=int, default=0, metavar="N",
                      help="start with the last N lines (0: from the start)")
    logs.add_argument("--controller", action="store_true",
                      help="the daemon's own log of the job: its status changes with their "
                           "reasons, and the daemon's log lines about it")
    cancel = actions.add_parser("cancel", help="cancel managed jobs (their clusters go too)")
    cancel.add_argument("job_ids", nargs="*", type=int)
    cancel.add_argument("-a", "--all", action="store_true", help="every unfinished job")
    cancel.add_argument("-n", "--name", dest="cancel_name", metavar="NAME",
                        help="the unfinished job of that name (refused if several have it)")


def check(args: argparse.Namespace) -> str | None:
    """What argparse cannot say of `jobs` options (a usage error, exit 2)."""
    if args.jobs_action == "cancel" and args.cancel_name is not None and (
            args.job_ids or args.all):
        return "jobs cancel: -n NAME picks the job; give it without ids or --all"
    if args.jobs_action == "queue":
        from clusterctl._times import TimeError, parse_when

        for option in ("since", "until"):
            value = getattr(args, option)
            try:
                parse_when(value, now=0.0) if value else None
            except TimeError as error:
                return f"jobs queue --{option}: {error}"
    return None


def main(client: Client, args: argparse.Namespace) -> int:
    action = args.jobs_action
    if action == "launch":
        return _launch(client, args)
    if action == "queue":
        return _queue(client, args)
    if action == "logs":
        return _follow(client, logs_request(args))
    if not args.job_ids and not args.all and args.cancel_name is None:
        fail("name the managed jobs to cancel", "give job ids, --all, or -n NAME")
    result = client.call(protocol.JobsCancelArgs(job_ids=args.job_ids, all=args.all,
                                                 name=args.cancel_name))
    for job_id in result.get("cancelled", []):
        sys.stderr.write(f"Managed job {job_id}: cancelling (its cluster is torn down).\n")
    for job_id in result.get("already_finished", []):
        sys.stderr.write(f"Managed job {job_id} has already ended.\n")
    return _exit_codes.SUCCEEDED


def logs_request(args: argparse.Namespace) -> protocol.JobsLogsArgs:
    if args.tail < 0:
        fail("--tail must be ≥ 0")
    return protocol.JobsLogsArgs(job_id=args.job_id, follow=not args.no_follow,
                                 tail=args.tail, controller=args.controller)


def _launch(client: Client, args: argparse.Namespace) -> int:
    if args.job_name and args.name and args.job_name != args.name:
        fail(f"-n and --name both name the job ({args.job_name[:40]!r}, {args.name[:40]!r})",
             "give one of them")
    args.name = args.job_name or args.name
    request = task_args(args, protocol.JobsLaunchArgs, infra=args.infra)
    return _follow(client, request, detach=args.detach)


def _follow(client: Client, request: protocol.OpArgs, detach: bool = False) -> int:
    printer = Printer()
    state: dict[str, Any] = {}
    stream = client.stream(request)
    try:
        for event, data in stream:
            if event == "managed_job":
                state.update(data)
                printer.note(f"Managed job {data['job_id']} submitted (its cluster: "
                             f"{data['cluster']}).")
            elif event in CONTROLLER_EVENTS:
                sys.stdout.write(controller_line(event, data) + "\n")
                sys.stdout.flush()
            else:
                printer.event(event, data, state)
    except KeyboardInterrupt:
        stream.detach()
        printer.finish_logs()
        job_id = state.get("job_id") or getattr(request, "job_id", None) or "ID"
        printer.note(f"Detached; managed job {job_id} goes on.\n"
                     f"  logs:   clusterctl jobs logs {job_id}\n"
                     f"  cancel: clusterctl jobs cancel {job_id}")
        return _exit_codes.NOT_FINISHED
    printer.finish_logs()
    result = stream.result or {}
    if detach:
        printer.note(f"  logs:   clusterctl jobs logs {result.get('job_id')}\n"
                     f"  cancel: clusterctl jobs cancel {result.get('job_id')}")
        return _exit_codes.SUCCEEDED
    line = f"Managed job {result.get('job_id')}: {result.get('status')}"
    if result.get("failure_reason"):
        line += f" ({result['failure_reason']})"
    printer.note(line)
    return int(result.get("exit_code", _exit_codes.ERROR))


CONTROLLER_EVENTS = ("managed_job_event", "daemon_log")


def controller_line(event: str, data: dict[str, Any]) -> str:
    """One entry of `jobs logs --controller`, in local time: a status change
    (`PENDING -> STARTING: launching a cluster`), a finding in a status
    (`RECOVERING: launch failed: ...`), or a daemon log line
    (`[warning] managed job's cluster lost  why=...`, a traceback below it)."""
    ts = data.get("ts") or 0
    when = (time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts)) + f".{int(ts % 1 * 1000):03d}"
            if ts else "-" * 23)
    if event == "managed_job_event":
        before, after = data.get("from_status"), data.get("to_status")
        status = f"{before} -> {after}" if before and before != after else str(after)
        return f"{when}  {status}: {data.get('reason', '')}"
    fields = dict(data.get("fields") or {})
    trace = fields.pop("exception", None)
    shown = "  ".join(f"{k}={_field(v)}" for k, v in fields.items())
    line = f"{when}  [{data.get('level', '?')}] {data.get('message', '')}"
    if shown:
        line += f"  {shown}"
    if trace:
        line += "\n" + "\n".join(f"    {t}" for t in str(trace).rstrip().splitlines())
    return line


def _field(value: Any) -> str:
    if isinstance(value, str) and value and not any(c.isspace() for c in value):
        return value
    return json.dumps(value, default=str)


def _duration(seconds: float | None) -> str:
    if not seconds:
        return "-"
    return age(time.time() - seconds, suffix="")


def _queue(client: Client, args: argparse.Namespace) -> int:
    window = args.since or args.until
    # A time window asks what was submitted then: finished jobs too, unless -s.
    finished = args.all or (window and not args.skip_finished)
    jobs = client.call(protocol.JobsQueueArgs(all=bool(finished))).get("jobs", [])
    if window:
        from clusterctl._times import submitted_within

        jobs = submitted_within(jobs, args.since, args.until, time.time())
    if args.json:
        print_json(jobs)
        return _exit_codes.SUCCEEDED
    if not jobs:
        print("No managed jobs in that window." if window else "No managed jobs."
              if args.all else
              "No unfinished managed jobs (finished ones too: clusterctl jobs queue --all).")
        return _exit_codes.SUCCEEDED
    headers = ["ID", "NAME", "RESOURCES", "SUBMITTED", "TOT. DURATION", "JOB DURATION",
               "#RECOVERIES", "COST", "STATUS", "INFRA", "REASON"]
    rows = [[str(j["job_id"]), j["name"], j.get("resources") or "-", age(j["submitted_at"]),
             _duration(j["total_seconds"]), _duration(j["job_seconds"]), str(j["recoveries"]),
             "-" if j.get("cost") is None else f"${j['cost']:.3f}",
             j["status"], j.get("infra") or "-", (j.get("status_reason") or "-")[:60]]
            for j in jobs]
    sys.stdout.write(table(headers, rows))
    return _exit_codes.SUCCEEDED
