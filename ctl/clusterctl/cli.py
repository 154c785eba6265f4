"""clusterctl: the command line of clusterd.

Exit codes: 0 succeeded, 100 the job failed, 101 not finished (detached), 102 not found,
103 cancelled, 1 any other error (with a one-line message and a hint on stderr).
"""

from __future__ import annotations

import os
import sys
import time

from clusterctl import _argv_cache, _exit_codes, protocol
from clusterctl._fail import fail, fail_with, report, worse
from clusterctl._render import Printer, age, render_plan, table
from clusterctl._task_options import print_json, task_args
from clusterctl.client import Client, ClusterdError, DaemonUnavailable, Stream

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable, Sequence
    from typing import Any

# -- commands -----------------------------------------------------------------------------------


def _drain(stream: Stream, printer: Printer, state: dict[str, Any]) -> dict[str, Any] | None:
    """Print a stream's events until its final reply; None if Ctrl-C detached from it."""
    try:
        for event, data in stream:
            printer.event(event, data, state)
    except KeyboardInterrupt:
        stream.detach()
        printer.finish_logs()
        return None
    except ClusterdError as error:
        printer.finish_logs()
        printer.phases()  # -v: how far it got, and where the time went
        fail_with(error)
    printer.finish_logs()
    printer.phases()
    return stream.result or {}


def _run_job_stream(client: Client, request: protocol.OpArgs, detach: bool,
                    verbose: bool = False) -> int:
    printer = Printer(verbose)
    state: dict[str, Any] = {}
    result = _drain(client.stream(request), printer, state)
    if result is None:
        client.close()
        cluster = state.get("cluster")
        job_id = state.get("job_id")
        if job_id is not None:
            printer.note(f"Detached; job {job_id} keeps running on {cluster}.\n"
                         f"  re-attach: clusterctl logs {cluster} {job_id}\n"
                         f"  cancel:    clusterctl cancel {cluster} {job_id}")
        else:
            printer.note(f"Detached; request {state.get('request_id')} goes on in clusterd.\n"
                         f"  watch: clusterctl status {cluster or ''}".rstrip())
        return _exit_codes.NOT_FINISHED
    job_id = result.get("job_id")
    cluster = result.get("cluster")
    if job_id is None:
        printer.note(f"Cluster {cluster} is ready; the task had nothing to run.")
        return _exit_codes.SUCCEEDED
    if detach:
        # "Job N submitted" was said when the job event came; said here only if it did not.
        said = "" if state.get("job_id") == job_id else f"Job {job_id} submitted to {cluster}.\n"
        printer.note(f"{said}  logs:   clusterctl logs {cluster} {job_id}\n"
                     f"  cancel: clusterctl cancel {cluster} {job_id}")
        return _exit_codes.SUCCEEDED
    printer.job_result(result)
    return int(result.get("exit_code", _exit_codes.ERROR))


def cmd_launch(client: Client, args: argparse.Namespace) -> int:
    request = task_args(args, protocol.LaunchArgs, cluster=args.cluster, infra=args.infra,
                         idle_minutes=args.idle_minutes, down=args.down,
                         retry_until_up=args.retry_until_up)
    return _run_task(client, args, request)


def cmd_exec(client: Client, args: argparse.Namespace) -> int:
    request = task_args(args, protocol.ExecArgs, cluster=args.cluster)
    return _run_task(client, args, request)


def _run_task(client: Client, args: argparse.Namespace, request: protocol.RunArgs) -> int:
    newer = sorted(n for n in request._newer if n in protocol.to_wire(request))
    if newer and protocol.FEATURE_RUN_OVERRIDES not in client.server_hello.get("features", ()):
        server = client.server_hello.get("server", "clusterd")
        fail(f"{server} is older than --{newer[0].replace('_', '-')}: it would refuse it",
             "stop that daemon (the next clusterctl command starts this version's)")
    if request.dryrun:
        plan = client.call(request)
        if args.json:
            print_json(plan)
        else:
            sys.stdout.write(render_plan(plan))
        return _exit_codes.SUCCEEDED
    return _run_job_stream(client, request, args.detach, args.verbose)


def cmd_status(client: Client, args: argparse.Namespace) -> int:
    if args.ip or args.endpoints or args.endpoint is not None:
        from clusterctl import _endpoints  # only for these

        return _endpoints.main(client, args)
    # Columns where the daemon offers them (its hello, on connecting, says): a fifth of the
    # decoding for many clusters.
    columns = protocol.FEATURE_COLUMNS in client.server_hello.get("features", ())
    result = client.call(protocol.StatusArgs(clusters=args.clusters, refresh=args.refresh,
                                             verbose=args.verbose or args.json,
                                             columns=columns))
    clusters = protocol.views_of(result.get("clusters", []))
    costs = result.get("costs") or {}
    for c in clusters:  # beside the views in the reply (they are cached); in them here
        if c["name"] in costs:
            c["cost_per_hour"], c["cost"] = costs[c["name"]]
    orphans = result.get("orphans", [])
    if args.json:
        print_json(clusters)
        return _exit_codes.SUCCEEDED
    if orphans:
        sys.stderr.write("Orphans (made by this daemon, named by no record; still costing):\n")
        for orphan in orphans:
            where = "/".join(p for p in (orphan["provider"], orphan.get("region")) if p)
            sys.stderr.write(f"  {where} {orphan['cloud_name']}: "
                             f"{len(orphan['instances'])} instance(s), "
                             f"{len(orphan['groups'])} security group(s) — remove: "
                             f"{orphan['remove']}\n")
    if not clusters:
        print("No clusters. Launch one: clusterctl launch -- echo hello")
        return _exit_codes.SUCCEEDED
    headers = ["NAME", "INFRA", "RESOURCES", "STATUS", "AUTOSTOP", "LAUNCHED", "REFRESHED",
               "COST $/H", "COST"]
    if args.verbose:
        headers += ["$/h", "REASON", "CLOUD NAME", "HOSTS", "TUNNEL"]
    rows = []
    for c in clusters:
        cpus = c.get("cpus")
        resources = f"{c['num_nodes']}x(cpus={cpus:g})" if cpus else f"{c['num_nodes']}x"
        if c.get("instance_type"):
            spot = ", spot" if c.get("spot") else ""
            resources = f"{c['num_nodes']}x({c['instance_type']}{spot})"
        autostop = "-"
        if c.get("autostopping"):
            autostop = "autostopping"
        elif c.get("autostop_minutes") is not None:
            autostop = f"{c['autostop_minutes']:g}m" + (" (down)" if c.get("autostop_down")
                                                         else "")
            deadline = c.get("autostop_deadline")
            if deadline and c["status"] == "UP":
                autostop += f", in {age(time.time(), until=deadline, suffix='')}" \
                    if deadline > time.time() else ", due"
        name = c["name"]
        if c.get("managed_job") is not None:  # the job's own: `jobs cancel`, not `down`
            name += f" (managed job {c['managed_job']})"
        row = [name, c["infra"], resources, c["status"], autostop,
               age(c.get("launched_at")), age(c.get("refreshed_at")),
               _dollars(c.get("cost_per_hour")), _dollars(c.get("cost"))]
        if args.verbose:
            tunnel = c.get("tunnel")
            price = c.get("price_per_hour")
            row += [f"{price:.3f}" if price else "-", c.get("status_reason") or "-",
                    c.get("cloud_name") or "-", ",".join(c.get("hosts") or []) or "-",
                    f"{tunnel['socket']} -> {tunnel['remote']}" if tunnel else "-"]
        rows.append(row)
    sys.stdout.write(table(headers, rows))
    return _exit_codes.SUCCEEDED


def _dollars(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def cmd_queue(client: Client, args: argparse.Namespace) -> int:
    """One cluster's jobs (as before), or several clusters' (every UP one's, if none is
    named) in one table with a CLUSTER column; a cluster that fails does not stop the rest."""
    names = list(dict.fromkeys(args.clusters))
    several = len(names) != 1
    if not names:
        views = protocol.views_of(client.call(protocol.StatusArgs()).get("clusters", []))
        names = [c["name"] for c in views if c["status"] == "UP"]
    results = client.call_many([protocol.QueueArgs(cluster=n, skip_finished=args.skip_finished)
                                for n in names]) if names else []
    code: int = _exit_codes.SUCCEEDED
    jobs: list[dict[str, Any]] = []
    for name, result in zip(names, results, strict=True):
        if isinstance(result, ClusterdError):
            if not several:
                fail_with(result)
            code = worse(code, report(name, result))
            continue
        jobs += [{**job, "cluster": name} for job in result.get("jobs", [])]
    if args.json:
        print_json(jobs)
        return code
    if several and not names:
        print("No UP clusters.")
        return code
    headers = ["ID", "NAME", "USER", "SUBMITTED", "STARTED", "DURATION", "RESOURCES",
               "STATUS", "LOG"]
    rows = [_job_row(job) for job in jobs]
    if several:
        sys.stdout.write(table(["CLUSTER", *headers],
                               [[job["cluster"], *row] for job, row in zip(jobs, rows,
                                                                           strict=True)]))
    else:
        sys.stdout.write(f"Jobs on {names[0]}:\n" + table(headers, rows))
    return code


def _job_row(job: dict[str, Any]) -> list[str]:
    started, ended = job.get("started_at"), job.get("ended_at")
    duration = "-"
    if started:
        duration = age(started, until=ended or time.time(), suffix="")
    return [str(job["job_id"]), job.get("name") or "-", job.get("user") or "-",
            age(job.get("submitted_at")), age(started), duration,
            job.get("resources") or "-", job["status"], job.get("log_dir") or "-"]


def cmd_logs(client: Client, args: argparse.Namespace) -> int:
    if args.status or args.sync_down:
        from clusterctl import _logs_cli  # only for these

        return (_logs_cli.status if args.status else _logs_cli.sync_down)(client, args)
    if args.tail < 0:
        fail("--tail must be ≥ 0")
    request = protocol.LogsArgs(cluster=args.cluster, job_id=args.job_id,
                                follow=not args.no_follow, tail=args.tail)
    printer = Printer()
    result = _drain(client.stream(request), printer, {})
    if result is None:
        return _exit_codes.NOT_FINISHED
    if args.no_follow and result.get("exit_code") == _exit_codes.NOT_FINISHED:
        printer.note(f"Job {result.get('job_id')} is {result.get('status')}.")
    else:
        printer.job_result(result)
    return int(result.get("exit_code", _exit_codes.ERROR))


def cmd_cancel(client: Client, args: argparse.Namespace) -> int:
    if not args.job_ids and not args.all:
        fail("name the jobs to cancel", "give job ids, or --all")
    result = client.call(protocol.CancelArgs(cluster=args.cluster, job_ids=args.job_ids,
                                             all=args.all))
    cancelled = result.get("cancelled", [])
    if cancelled:
        print(f"Cancelled job(s) {', '.join(map(str, cancelled))} on {args.cluster}.")
    else:
        print(f"No active job to cancel on {args.cluster}.")
    for job_id in result.get("already_finished", []):
        print(f"Job {job_id} had already finished.")
    return _exit_codes.SUCCEEDED


def cmd_lifecycle(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _lifecycle_cli  # only when stop, start, down or autostop runs

    return _lifecycle_cli.main(client, args)


def _event_row(e: dict[str, Any]) -> list[str]:
    change = (f"{e.get('from_status') or '-'} -> {e.get('to_status') or '-'}"
              if e.get("kind") == "status" else e.get("kind", ""))
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"]))
    reason = " ".join(str(e["reason"]).split())  # one line per event in the table
    return [when, e["cluster"], change, reason, str(e.get("request_id") or "-")]


def cmd_events(client: Client, args: argparse.Namespace) -> int:
    if args.follow:
        return _follow_events(client, args)
    result = client.call(protocol.EventsArgs(cluster=args.cluster, limit=args.limit))
    events = result.get("events", [])
    if args.json:
        print_json(events)
        return _exit_codes.SUCCEEDED
    if not events:
        print("No events.")
        return _exit_codes.SUCCEEDED
    sys.stdout.write(table(["TIME", "CLUSTER", "CHANGE", "REASON", "REQUEST"],
                           [_event_row(e) for e in events]))
    return _exit_codes.SUCCEEDED


def _follow_events(client: Client, args: argparse.Namespace) -> int:
    import json  # only here and for --json

    stream = client.stream(protocol.EventsArgs(cluster=args.cluster, limit=args.limit,
                                               follow=True))
    try:
        for name, data in stream:
            if name != "cluster_event":
                continue
            line = json.dumps(data, sort_keys=True) if args.json else "  ".join(_event_row(data))
            print(line, flush=True)
    except KeyboardInterrupt:
        stream.detach()
    except BrokenPipeError:
        os._exit(0)
    return _exit_codes.SUCCEEDED


def cmd_requests(client: Client, args: argparse.Namespace) -> int:
    result = client.call(protocol.RequestsArgs(active_only=not args.all))
    if args.json:
        print_json(result)
        return _exit_codes.SUCCEEDED
    running = result.get("running", [])
    rows = [[str(r["id"]), r["op"], r.get("cluster") or "-", f"{r['running_for']:.0f}s",
             "RUNNING"] for r in running]
    for r in result.get("recent", []):
        if r["status"] != "RUNNING":
            rows.append([str(r["id"]), r["op"], r.get("cluster") or "-", "-", r["status"]])
    sys.stdout.write(table(["ID", "OP", "CLUSTER", "RUNNING FOR", "STATUS"], rows))
    return _exit_codes.SUCCEEDED


def cmd_check(client: Client, args: argparse.Namespace) -> int:
    result = client.call(protocol.CheckArgs(providers=args.providers))
    if args.json:
        print_json(result)
        return _exit_codes.SUCCEEDED
    for name, provider in result.get("providers", {}).items():
        state = "available" if provider.get("ok") else "unavailable"
        print(f"{name}: {state} ({provider.get('detail', '')})")
        if provider.get("regions"):
            print(f"  regions enabled: {', '.join(provider['regions'])}")
        if provider.get("hint") and not provider.get("ok"):
            print(f"  hint: {provider['hint']}")
    hosts = result.get("hosts", [])
    if not hosts:
        return _exit_codes.SUCCEEDED
    print(f"ssh: node pools from {result.get('pools_file')}")
    rows = [[h["pool"], f"{h['user']}@{h['host']}:{h['port']}",
             "ok" if h["ok"] else f"UNREACHABLE: {h['error']}", h.get("cluster") or "free",
             (h.get("host_key") or "-") + (" (new: pinned now)" if h.get("new_host_key")
                                           else "")]
            for h in hosts]
    sys.stdout.write(table(["POOL", "HOST", "SSH", "IN USE BY", "HOST KEY"], rows))
    return _exit_codes.SUCCEEDED if all(h["ok"] for h in hosts) else _exit_codes.ERROR


def _price(value: Any) -> str:
    return "-" if value is None else f"${value:,.3f}"


def cmd_show_gpus(client: Client, args: argparse.Namespace) -> int:
    rows = client.call(protocol.ShowGpusArgs(name=args.name, infra=args.infra,
                                             count=args.count)).get("accelerators", [])
    if args.json:
        print_json(rows)
        return _exit_codes.SUCCEEDED
    # Nodes that are there (kubernetes), then a cloud's catalog of instance types.
    nodes = [r for r in rows if "node" in r]
    rows = [r for r in rows if "node" not in r]
    if nodes:
        sys.stdout.write(table(
            ["CONTEXT", "NODE", "ACCELERATOR", "TOTAL", "FREE", "vCPUs", "MEMORY"],
            [[r["region"], r["node"], r["accelerator"], f"{r['count']:g}", f"{r['free']:g}",
              f"{r['vcpus']:g}", f"{r['memory_gb']:g}GB"] for r in nodes]))
        if not rows:
            return _exit_codes.SUCCEEDED
        print()
    if args.name:
        table_rows = [[r["accelerator"], f"{r['count']:g}", r["instance_type"],
                       f"{r['vcpus']:g}", f"{r['memory_gb']:g}GB", _price(r["price"]),
                       _price(r["spot_price"]), ", ".join(r["regions"])] for r in rows]
        sys.stdout.write(table(["ACCELERATOR", "COUNT", "INSTANCE TYPE", "vCPUs", "MEMORY",
                                "ON-DEMAND $/h", "SPOT $/h", "REGIONS"], table_rows))
        return _exit_codes.SUCCEEDED
    summary: dict[str, dict[str, Any]] = {}
    for r in rows:
        entry = summary.setdefault(r["accelerator"], {"counts": [], "price": None,
                                                      "spot": None, "regions": set()})
        if r["count"] not in entry["counts"]:
            entry["counts"].append(r["count"])
        for key, value in (("price", r["price"]), ("spot", r["spot_price"])):
            if value is not None and (entry[key] is None or value < entry[key]):
                entry[key] = value
        entry["regions"].update(r["regions"])
    table_rows = [[name, ",".join(f"{c:g}" for c in sorted(e["counts"])), _price(e["price"]),
                   _price(e["spot"]), str(len(e["regions"]))] for name, e in summary.items()]
    sys.stdout.write(table(["ACCELERATOR", "COUNTS", "FROM ON-DEMAND $/h", "FROM SPOT $/h",
                            "REGIONS"], table_rows))
    print("Prices are per instance and hour (AWS catalog). "
          "`clusterctl show-gpus NAME` lists instance types.")
    return _exit_codes.SUCCEEDED


def cmd_jobs(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _jobs_cli  # only when `jobs` runs

    return _jobs_cli.main(client, args)


def cmd_ssh(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _ssh_cli  # only when `ssh` runs

    return _ssh_cli.main(client, args)


def cmd_storage(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _storage_cli  # only when `storage` runs

    return _storage_cli.main(client, args)


def cmd_history(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _history_cli  # only when `history` runs

    return _history_cli.main(client, args)


def cmd_cost_report(client: Client, args: argparse.Namespace) -> int:
    from clusterctl import _cost_cli  # only when `cost-report` runs

    return _cost_cli.main(client, args)


COMMANDS: dict[str, Callable[[Client, argparse.Namespace], int]] = {
    "launch": cmd_launch,
    "exec": cmd_exec,
    "status": cmd_status,
    "queue": cmd_queue,
    "logs": cmd_logs,
    "cancel": cmd_cancel,
    "stop": cmd_lifecycle,
    "start": cmd_lifecycle,
    "down": cmd_lifecycle,
    "events": cmd_events,
    "requests": cmd_requests,
    "check": cmd_check,
    "autostop": cmd_lifecycle,
    "show-gpus": cmd_show_gpus,
    "jobs": cmd_jobs,
    "ssh": cmd_ssh,
    "storage": cmd_storage,
    "history": cmd_history,
    "cost-report": cmd_cost_report,
}


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """The command line parsed by argparse (what main parses when it has not kept it)."""
    from clusterctl._parser import parse as parse_with_argparse

    return parse_with_argparse(argv)


def main(argv: Sequence[str] | None = None) -> None:
    words = sys.argv[1:] if argv is None else list(argv)
    args = _argv_cache.recall(words)
    if args is None:
        args = parse(words)
        _argv_cache.keep(words, args)
    if args.verb == "dashboard":  # a server of its own, not one call: it manages its client
        from clusterctl.dashboard import main as dashboard

        sys.exit(dashboard(args))
    if args.verb == "completion":  # a script made from the parser; a client only for names
        from clusterctl._completion import main as completion
        from clusterctl._parser import build_parser

        _exit(completion(args, build_parser))
    autostart = False if args.no_autostart else None

    def announce(log_path: Any) -> None:
        sys.stderr.write(f"Starting clusterd (log: {log_path})...\n")

    client = Client(args.socket, autostart=autostart, on_autostart=announce)
    try:
        with client:
            for notice in protocol.notices_of(client.server_hello):
                sys.stderr.write(f"clusterd: {notice}\n")
            code = COMMANDS[args.verb](client, args)
    except DaemonUnavailable as error:
        fail(error.message, error.hint)
    except ClusterdError as error:
        fail_with(error)
    except KeyboardInterrupt:
        sys.exit(_exit_codes.NOT_FINISHED)
    except BrokenPipeError:
        # stdout closed early (e.g. piped into head): not an error worth a traceback.
        os._exit(0)
    _exit(code)


def _exit(code: int) -> None:
    """Exit with `code` once what was written is out, without the interpreter's teardown:
    freeing every module and object one by one is work nobody waits for (nothing of ours
    runs at exit; the daemon's socket closes with the process)."""
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:
        os._exit(0)
    os._exit(code)


if __name__ == "__main__":
    main()
