"""clusterctl's command line, parsed with argparse: each verb's options, and the parser of
the verb given. Imported only for a command line clusterctl has not parsed before
(_argv_cache.py keeps what it parsed to)."""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Sequence

from clusterctl import protocol
from clusterctl._task_options import add_run_options, add_task_options
from clusterctl._version import __version__

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import Any

# argparse looks each of its messages up in gettext's catalogs, every time, importing `locale`
# for the first: 1.2-1.4 ms of every run, for catalogs Python does not ship (and clusterctl's
# own messages are English). Its messages are used as they are.
argparse._ = lambda message: message  # type: ignore[attr-defined]
argparse.ngettext = (  # type: ignore[attr-defined]
    lambda singular, plural, count: singular if count == 1 else plural)

# -- argument parsing ---------------------------------------------------------------------------


def _launch_options(launch: argparse.ArgumentParser) -> None:
    launch.add_argument("-c", "--cluster", help="cluster name (default: a generated one)")
    launch.add_argument("--infra", help="where to run: local (default), ssh/POOL, aws, "
                                        "aws/REGION, aws/REGION/ZONE")
    launch.add_argument("-i", "--idle-minutes-to-autostop", dest="idle_minutes", type=float,
                        metavar="MIN", help="stop the cluster after MIN idle minutes")
    launch.add_argument("--down", action="store_true",
                        help="tear the cluster down (not stop) when idle; alone: as soon as idle")
    launch.add_argument("-r", "--retry-until-up", action="store_true",
                        help="when no place has capacity, wait and try them all again (with a "
                             "growing gap) until the cluster is up; `down` calls it off")
    add_task_options(launch)
    add_run_options(launch, "launch")
    _verbose_option(launch)


def _verbose_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-v", "--verbose", action="store_true",
                        help="name each progress line's phase, and say how long each took")


def _exec_options(exec_: argparse.ArgumentParser) -> None:
    exec_.add_argument("cluster")
    add_task_options(exec_)
    add_run_options(exec_, "exec")
    _verbose_option(exec_)


def _status_options(status: argparse.ArgumentParser) -> None:
    status.add_argument("clusters", nargs="*")
    status.add_argument("-r", "--refresh", action="store_true",
                        help="ask the providers and agents for the true state first")
    status.add_argument("-v", "--verbose", action="store_true")
    status.add_argument("--json", action="store_true")
    one = status.add_mutually_exclusive_group()
    one.add_argument("--ip", action="store_true",
                     help="print the head node's IP only (of the one cluster named)")
    one.add_argument("--endpoints", action="store_true",
                     help="print the task's ports (resources.ports) as URLs, http://IP:PORT")
    one.add_argument("--endpoint", type=int, metavar="PORT",
                     help="print one port's URL")


def _queue_options(queue: argparse.ArgumentParser) -> None:
    queue.add_argument("clusters", nargs="*", metavar="CLUSTER",
                       help="whose jobs (default: every UP cluster's)")
    queue.add_argument("-s", "--skip-finished", action="store_true")
    queue.add_argument("--json", action="store_true")


def _logs_options(logs: argparse.ArgumentParser) -> None:
    logs.add_argument("cluster")
    logs.add_argument("jobs", nargs="*", metavar="JOB_ID",
                      help="the job (default: the latest); with --sync-down, several, and a "
                           "last word that is not a number is the directory to copy to")
    logs.add_argument("--no-follow", action="store_true", help="print what is there and exit")
    logs.add_argument("--tail", type=int, default=0, metavar="N",
                      help="start with the last N lines (0: from the start)")
    logs.add_argument("--status", action="store_true",
                      help="print the job's status only, and exit with its code (0 succeeded, "
                           "100 failed, 101 not finished, 103 cancelled)")
    logs.add_argument("-s", "--sync-down", action="store_true",
                      help="copy the jobs' logs to this machine (default directory: "
                           "~/clusterd_logs/CLUSTER; each job's in JOB_ID/run.log there)")


def _cancel_options(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument("cluster")
    cancel.add_argument("job_ids", nargs="*", type=int)
    cancel.add_argument("-a", "--all", action="store_true", help="cancel every active job")


def _many_clusters(sub: argparse.ArgumentParser, verb: str) -> None:
    """CLUSTER... with globs, -a/--all and -y/--yes (see _targets.py)."""
    picks = {"stop": "that are UP or INIT", "start": "that are STOPPED or INIT",
             "down": "of any status", "autostop": "that are UP"}[verb]
    sub.add_argument("clusters", nargs="*", metavar="CLUSTER",
                     help="cluster names, or shell-style patterns in quotes ('dev-*'), "
                          f"which pick among the clusters {picks} (never a managed job's)")
    sub.add_argument("-a", "--all", action="store_true", help=f"every cluster {picks}")
    sub.add_argument("-y", "--yes", action="store_true",
                     help="do not ask for confirmation (asked only on a terminal)")


def _lifecycle_options(verb: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(sub: argparse.ArgumentParser) -> None:
        _many_clusters(sub, verb)
        if verb == "down":
            sub.add_argument("-p", "--purge", action="store_true",
                             help="forget the cluster even if cleanup fails")
            sub.add_argument("--orphan", action="store_true",
                             help="the names are orphans' cloud names (see `status`): "
                                  "terminate what they left")
        if verb == "start":
            _verbose_option(sub)
    return add


def _events_options(events: argparse.ArgumentParser) -> None:
    events.add_argument("cluster", nargs="?")
    events.add_argument("-n", "--limit", type=int, default=50)
    events.add_argument("-f", "--follow", action="store_true",
                        help="then print new events as they happen (Ctrl-C to stop)")
    events.add_argument("--json", action="store_true",
                        help="JSON (with --follow: one JSON object per line)")


def _autostop_options(autostop: argparse.ArgumentParser) -> None:
    _many_clusters(autostop, "autostop")
    autostop.add_argument("-i", "--idle-minutes", type=float, metavar="MIN",
                          help="stop after MIN idle minutes (fractions allowed; default: 5, "
                               "as SkyPilot's)")
    autostop.add_argument("--down", action="store_true", help="tear down instead of stopping")
    autostop.add_argument("--wait-for", choices=protocol.WAIT_FOR_CHOICES,
                          default="jobs_and_ssh",
                          help="what counts as busy: jobs and SSH sessions (default), jobs "
                               "only, or nothing (a hard deadline from now)")
    autostop.add_argument("--cancel", action="store_true", help="remove autostop")


def _requests_options(requests: argparse.ArgumentParser) -> None:
    requests.add_argument("-a", "--all", action="store_true", help="include finished ones")
    requests.add_argument("--json", action="store_true")


def _check_options(check: argparse.ArgumentParser) -> None:
    check.add_argument("providers", nargs="*", metavar="PROVIDER",
                       help="check only these (local, ssh, aws, kubernetes; default: all)")
    check.add_argument("--json", action="store_true")


def _show_gpus_options(show: argparse.ArgumentParser) -> None:
    show.add_argument("name", nargs="?", metavar="NAME[:COUNT]",
                      help="one accelerator (e.g. A100): its instance types and prices; "
                           "with a count (A100:8), only those with that many")
    show.add_argument("--infra", metavar="PROVIDER",
                      help="one provider's only (kubernetes: what its nodes have and have free)")
    show.add_argument("--json", action="store_true")


def _jobs() -> Any:
    import clusterctl._jobs_cli  # only when `jobs` runs

    return clusterctl._jobs_cli


def _ssh() -> Any:
    import clusterctl._ssh_cli  # only when `ssh` runs

    return clusterctl._ssh_cli


def _completion() -> Any:
    import clusterctl._completion  # only when `completion` runs

    return clusterctl._completion


def _history() -> Any:
    import clusterctl._history_cli  # only when `history` runs

    return clusterctl._history_cli


def _cost() -> Any:
    import clusterctl._cost_cli  # only when `cost-report` runs

    return clusterctl._cost_cli


def _storage() -> Any:
    import clusterctl._storage_cli  # only when `storage` runs

    return clusterctl._storage_cli


VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "launch": ("create (or reuse) a cluster and run a task on it", _launch_options),
    "exec": ("run a task on an UP cluster (setup is skipped)", _exec_options),
    "status": ("show clusters", _status_options),
    "queue": ("show clusters' jobs (default: every UP cluster's)", _queue_options),
    "logs": ("stream a job's log (default: the latest job); --status, --sync-down",
             _logs_options),
    "cancel": ("cancel jobs", _cancel_options),
    "stop": ("stop clusters (keep their disks): names, 'patterns*' or --all",
             _lifecycle_options("stop")),
    "start": ("start stopped clusters: names, 'patterns*' or --all",
              _lifecycle_options("start")),
    "down": ("tear clusters down: names, 'patterns*' or --all", _lifecycle_options("down")),
    "events": ("show cluster events (status changes, reasons)", _events_options),
    "requests": ("show requests the daemon is working on", _requests_options),
    "check": ("show usable infra: providers, credentials, ssh node pools and their hosts",
              _check_options),
    "show-gpus": ("show accelerators on offer: instance types, counts, prices, regions",
                  _show_gpus_options),
    "autostop": ("stop (or tear down) clusters after they have been idle a while",
                 _autostop_options),
    "jobs": ("managed jobs: launch, queue, logs, cancel (recovered when their cluster is lost)",
             lambda sub: _jobs().add_options(sub)),
    "ssh": ("a login shell (or a command) on a cluster's node, through your own ssh",
            lambda sub: _ssh().add_options(sub)),
    "storage": ("buckets clusterd made for file_mounts: ls, delete",
                lambda sub: _storage().add_options(sub)),
    "completion": ("print a shell completion script (bash, zsh, fish) for clusterctl",
                   lambda sub: _completion().add_options(sub)),
    "history": ("torn-down clusters, their jobs and kept logs (`logs CLUSTER JOB` reads them)",
                lambda sub: _history().add_options(sub)),
    "cost-report": ("what clusters and managed jobs cost: split, per provider, per day",
                    lambda sub: _cost().add_options(sub)),
    # Its package (and its web libraries) are imported only when this verb runs.
    "dashboard": ("a live web dashboard of your clusters and jobs (127.0.0.1, with a token)",
                  lambda sub: __import__("clusterctl.dashboard").dashboard.add_options(sub)),
}


def _global_options(parser: argparse.ArgumentParser, *, top: bool) -> None:
    """clusterctl's own options, which people type after the verb as often as before it
    (`clusterctl status --socket S`): on the top-level parser, and on every verb's and
    action's parser (see _Verbs). Below the top their default is SUPPRESS: argparse copies
    everything a verb's parser parsed over what the top parsed, and a default there would
    undo `--socket S status`."""
    unset: dict[str, Any] = {} if top else {"default": argparse.SUPPRESS}
    group = parser if top else parser.add_argument_group(
        "clusterctl's options (also accepted before the command)")
    group.add_argument("--version", action="version", version=f"clusterctl {__version__}")
    group.add_argument("--socket", **unset,
                       help="clusterd's control socket (default: "
                            "$XDG_RUNTIME_DIR/clusterd/clusterd.sock, or $CLUSTERD_SOCKET)")
    group.add_argument("--no-autostart", action="store_true", **unset,
                       help="do not start clusterd when none answers "
                            "(or set CLUSTERD_NO_AUTOSTART=1)")


class _Verbs(argparse._SubParsersAction):  # type: ignore[type-arg]
    """Verbs (and a verb's actions, as `jobs launch`): each parser made gets clusterctl's
    own options, once, here, whoever adds the verb."""

    def add_parser(self, name: str, **kwargs: Any) -> argparse.ArgumentParser:
        parser: argparse.ArgumentParser = super().add_parser(name, **kwargs)
        _global_options(parser, top=False)
        return parser


class _Parser(argparse.ArgumentParser):
    """argparse's parser, told the terminal's width: by itself each formatter asks shutil,
    and importing shutil was 5 ms of every run (a formatter is made for each argument added,
    not only for --help). Subparsers are of this class too, and their subparsers _Verbs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.register("action", "parsers", _Verbs)

    def _get_formatter(self) -> argparse.HelpFormatter:
        return argparse.HelpFormatter(prog=self.prog, width=_columns() - 2)


def _columns() -> int:
    """What shutil.get_terminal_size would say: $COLUMNS, else stdout's terminal, else 80."""
    try:
        return int(os.environ["COLUMNS"])
    except (KeyError, ValueError):
        pass
    try:
        return os.get_terminal_size(sys.__stdout__.fileno()).columns  # type: ignore[union-attr]
    except (AttributeError, ValueError, OSError):
        return 80


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    """The parser; with `only` (the verb given), that verb alone: building every verb's
    parser cost 10 ms of each run, a sixth of `clusterctl status`. The top-level --help,
    asked with no verb, lists them all."""
    parser = _Parser(
        prog="clusterctl", description="Run tasks on your clusters through clusterd.",
        epilog="clusterctl's own options (--socket, --no-autostart, --version) may also "
               "follow the command. Exit codes: 0 ok, 100 job failed, 101 not finished, "
               "102 not found, 103 cancelled, 1 error, 2 usage. Shell completion: "
               "clusterctl completion --help.",
    )
    _global_options(parser, top=True)
    verbs = parser.add_subparsers(dest="verb", metavar="COMMAND")
    verbs.required = True
    for verb, (text, add_options) in VERBS.items():
        if only is None or only == verb:
            add_options(verbs.add_parser(verb, help=text))
    return parser


def parse(argv: Sequence[str]) -> argparse.Namespace:
    """Options may come anywhere before the command; everything after `--` is the command."""
    words = list(argv)
    parser = build_parser(next((w for w in words if w in VERBS), None))
    command: list[str] = []
    if "--" in words:
        split = words.index("--")
        words, command = words[:split], words[split + 1:]
    args, extra = parser.parse_known_args(words)
    if hasattr(args, "entrypoint"):
        unknown = [word for word in extra if word.startswith("-")]
        if unknown:
            parser.error(f"unrecognized arguments: {' '.join(unknown)} "
                         "(put a command's own options after --)")
        args.entrypoint = [*args.entrypoint, *extra, *command]
        # After `--`, the words are a command whatever they look like (see task_args).
        args.command_given = bool(command)
        if getattr(args, "json", False) and not args.dryrun:  # launch, exec
            parser.error("--json goes with --dryrun (a job's output is its log)")
    elif extra or command:
        parser.error(f"unrecognized arguments: {' '.join([*extra, *command])}")
    check = CHECKS.get(args.verb)
    if check is not None:
        problem = check(args)
        if problem:
            parser.error(problem)
    return args


# -- what argparse cannot say ------------------------------------------------------------------
# Each checks (and completes) a verb's parsed options; a problem is a usage error (exit 2).
# They see the words only, never the environment or the clock (see _argv_cache.py).


def _check_many(args: argparse.Namespace) -> str | None:
    if not args.clusters and not args.all:
        return f"{args.verb}: name clusters (or patterns: 'dev-*'), or give --all"
    from clusterctl._targets import is_pattern

    if getattr(args, "orphan", False) and (args.all or any(map(is_pattern, args.clusters))):
        return "down --orphan: name the orphans (their cloud names, as `status` lists them)"
    return None


def _check_status(args: argparse.Namespace) -> str | None:
    asked = "--ip" if args.ip else "--endpoints" if args.endpoints else (
        "--endpoint" if args.endpoint is not None else None)
    if asked and len(args.clusters) != 1:
        return f"status {asked} takes one cluster"
    if args.endpoint is not None and not 1 <= args.endpoint <= 65535:
        return "--endpoint: a port is from 1 to 65535"
    return None


def _check_logs(args: argparse.Namespace) -> str | None:
    """`jobs` into job_ids (and `job_id`: the one given, or None), and with --sync-down a
    last word that is not a number into sync_dir."""
    words = list(args.jobs)
    args.sync_dir = None
    if args.sync_down and words and not words[-1].isdigit():
        args.sync_dir = words.pop()
    bad = [w for w in words if not w.isdigit() or int(w) < 1]
    if bad:
        return f"logs: a job id is a number from 1, not {bad[0][:40]!r}"
    args.job_ids = [int(w) for w in words]
    if args.status and args.sync_down:
        return "logs: give --status or --sync-down, not both"
    if len(args.job_ids) > 1 and not args.sync_down:
        return "logs: one job at a time (several with --sync-down)"
    args.job_id = args.job_ids[0] if args.job_ids else None
    return None


def _check_show_gpus(args: argparse.Namespace) -> str | None:
    """NAME:COUNT (SkyPilot's `A100:8`) into name and count."""
    args.count = None
    if args.name and ":" in args.name:
        name, _, count = args.name.rpartition(":")
        try:
            args.count = float(count)
        except ValueError:
            return f"show-gpus: {args.name[:40]!r}: the count after ':' is a number (A100:8)"
        if not name or not 0 < args.count < 2**31:
            return f"show-gpus: {args.name[:40]!r}: give NAME:COUNT, a count above 0 (A100:8)"
        args.name = name
    return None


CHECKS: dict[str, Callable[[argparse.Namespace], str | None]] = {
    "stop": _check_many, "start": _check_many, "down": _check_many, "autostop": _check_many,
    "status": _check_status, "logs": _check_logs, "show-gpus": _check_show_gpus,
    "jobs": lambda args: _jobs().check(args),
}
