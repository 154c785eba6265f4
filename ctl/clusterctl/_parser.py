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


def _queue_options(queue: argparse.ArgumentParser) -> None:
    queue.add_argument("cluster")
    queue.add_argument("-s", "--skip-finished", action="store_true")
    queue.add_argument("--json", action="store_true")


def _logs_options(logs: argparse.ArgumentParser) -> None:
    logs.add_argument("cluster")
    logs.add_argument("job_id", nargs="?", type=int)
    logs.add_argument("--no-follow", action="store_true", help="print what is there and exit")
    logs.add_argument("--tail", type=int, default=0, metavar="N",
                      help="start with the last N lines (0: from the start)")


def _cancel_options(cancel: argparse.ArgumentParser) -> None:
    cancel.add_argument("cluster")
    cancel.add_argument("job_ids", nargs="*", type=int)
    cancel.add_argument("-a", "--all", action="store_true", help="cancel every active job")


def _lifecycle_options(verb: str) -> Callable[[argparse.ArgumentParser], None]:
    def add(sub: argparse.ArgumentParser) -> None:
        sub.add_argument("clusters", nargs="+")
        if verb == "down":
            sub.add_argument("-p", "--purge", action="store_true",
                             help="forget the cluster even if cleanup fails")
            sub.add_argument("--orphan", action="store_true",
                             help="the names are orphans' cloud names (see `status`): "
                                  "terminate what they left")
        if verb in ("stop", "down"):
            sub.add_argument("-y", "--yes", action="store_true", help="do not ask")
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
    autostop.add_argument("cluster")
    autostop.add_argument("-i", "--idle-minutes", type=float, metavar="MIN",
                          help="stop after MIN idle minutes (fractions allowed)")
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
    check.add_argument("--json", action="store_true")


def _show_gpus_options(show: argparse.ArgumentParser) -> None:
    show.add_argument("name", nargs="?", metavar="NAME",
                      help="one accelerator (e.g. A100): its instance types and prices")
    show.add_argument("--infra", metavar="PROVIDER",
                      help="one provider's only (kubernetes: what its nodes have and have free)")
    show.add_argument("--json", action="store_true")


def _jobs() -> Any:
    import clusterctl._jobs_cli  # only when `jobs` runs

    return clusterctl._jobs_cli


def _storage() -> Any:
    import clusterctl._storage_cli  # only when `storage` runs

    return clusterctl._storage_cli


VERBS: dict[str, tuple[str, Callable[[argparse.ArgumentParser], None]]] = {
    "launch": ("create (or reuse) a cluster and run a task on it", _launch_options),
    "exec": ("run a task on an UP cluster (setup is skipped)", _exec_options),
    "status": ("show clusters", _status_options),
    "queue": ("show a cluster's jobs", _queue_options),
    "logs": ("stream a job's log (default: the latest job)", _logs_options),
    "cancel": ("cancel jobs", _cancel_options),
    "stop": ("stop clusters (keep their disks)", _lifecycle_options("stop")),
    "start": ("start stopped clusters", _lifecycle_options("start")),
    "down": ("tear clusters down", _lifecycle_options("down")),
    "events": ("show cluster events (status changes, reasons)", _events_options),
    "requests": ("show requests the daemon is working on", _requests_options),
    "check": ("show usable infra: providers, credentials, ssh node pools and their hosts",
              _check_options),
    "show-gpus": ("show accelerators on offer: instance types, counts, prices, regions",
                  _show_gpus_options),
    "autostop": ("stop (or tear down) a cluster after it has been idle a while",
                 _autostop_options),
    "jobs": ("managed jobs: launch, queue, logs, cancel (recovered when their cluster is lost)",
             lambda sub: _jobs().add_options(sub)),
    "storage": ("buckets clusterd made for file_mounts: ls, delete",
                lambda sub: _storage().add_options(sub)),
    # Its package (and its web libraries) are imported only when this verb runs.
    "dashboard": ("a live web dashboard of your clusters and jobs (127.0.0.1, with a token)",
                  lambda sub: __import__("clusterctl.dashboard").dashboard.add_options(sub)),
}


class _Parser(argparse.ArgumentParser):
    """argparse's parser, told the terminal's width: by itself each formatter asks shutil,
    and importing shutil was 5 ms of every run (a formatter is made for each argument added,
    not only for --help). Subparsers are of this class too."""

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
        epilog="Exit codes: 0 ok, 100 job failed, 101 not finished, 102 not found, "
               "103 cancelled, 1 error.",
    )
    parser.add_argument("--version", action="version", version=f"clusterctl {__version__}")
    parser.add_argument("--socket", help="clusterd's control socket (default: "
                        "$XDG_RUNTIME_DIR/clusterd/clusterd.sock, or $CLUSTERD_SOCKET)")
    parser.add_argument("--no-autostart", action="store_true",
                        help="do not start clusterd when none answers "
                             "(or set CLUSTERD_NO_AUTOSTART=1)")
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
    return args
