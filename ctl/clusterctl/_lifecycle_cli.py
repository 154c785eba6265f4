"""`stop`, `start`, `down` and `autostop` of one or many clusters: names, globs and `--all`
(see _targets.py), a confirmation before acting on more than one, each cluster's request
sent at once, and the worst outcome as the exit code. Imported only when those verbs run."""

from __future__ import annotations

import sys

from clusterctl import _exit_codes, protocol
from clusterctl._fail import fail, report, worse
from clusterctl._render import Printer
from clusterctl._targets import PICKED, is_pattern, resolve
from clusterctl.client import Client, ClusterdError

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from typing import Any

# SkyPilot's `sky autostop CLUSTER` without -i: five idle minutes.
DEFAULT_IDLE_MINUTES = 5.0
DOING = {"stop": "Stopping", "down": "Tearing down", "start": "Starting",
         "autostop": "Setting autostop of"}
DONE = {"stop": "stopped", "start": "started", "down": "torn down"}


def confirm(question: str, assume_yes: bool) -> None:
    """Ask on a terminal (a script's stdin is not one: it is never asked)."""
    if assume_yes or not sys.stdin.isatty():
        return
    answer = input(f"{question} [Y/n] ").strip().lower()
    if answer not in ("", "y", "yes"):
        fail("aborted", code=_exit_codes.ERROR)


def pick(client: Client, args: argparse.Namespace) -> tuple[list[str], int]:
    """The clusters the command line names (each once), and the exit code so far:
    NOT_FOUND when a pattern matched nothing. Nothing at all to act on: exit 102."""
    words: list[str] = list(args.clusters)
    every: bool = args.all
    if not every and not any(is_pattern(w) for w in words):
        return list(dict.fromkeys(words)), _exit_codes.SUCCEEDED  # no status call needed
    clusters = protocol.views_of(client.call(protocol.StatusArgs()).get("clusters", []))
    targets = resolve(args.verb, words, every, clusters)
    for name in targets.skipped:
        sys.stderr.write(f"Skipping {name}: a managed job's cluster "
                         "(`clusterctl jobs cancel` ends the job and its cluster).\n")
    for word in targets.unmatched:
        sys.stderr.write(f"clusterctl: error: no cluster matches {word!r}\n")
    if not targets.names:
        fail("no cluster to act on" if every and not words else
             f"nothing matches {' '.join(words)}",
             "`clusterctl status` lists clusters (a pattern picks those a "
             f"`{args.verb}` can change: {', '.join(PICKED[args.verb])})", _exit_codes.NOT_FOUND)
    code = _exit_codes.NOT_FOUND if targets.unmatched else _exit_codes.SUCCEEDED
    return targets.names, code


def ask(args: argparse.Namespace, names: list[str], widened: bool) -> None:
    """Stop and down ask even for one cluster (as they always have); start and autostop
    only when several, or a pattern or --all, picked them."""
    if args.verb in ("start", "autostop") and len(names) == 1 and not widened:
        return
    listed = "".join(f"  {name}\n" for name in names)
    what = "cluster" if len(names) == 1 else "clusters"
    confirm(f"{DOING[args.verb]} {len(names)} {what}:\n{listed}Proceed?", args.yes)


def requests_for(args: argparse.Namespace, names: list[str]) -> list[protocol.OpArgs]:
    verb = args.verb
    if verb == "down":
        return [protocol.DownArgs(cluster=n, purge=args.purge, orphan=args.orphan)
                for n in names]
    if verb == "stop":
        return [protocol.StopArgs(cluster=n) for n in names]
    if verb == "start":
        return [protocol.StartArgs(cluster=n) for n in names]
    minutes = args.idle_minutes
    if minutes is None and not args.cancel:
        minutes = DEFAULT_IDLE_MINUTES
    return [protocol.AutostopArgs(cluster=n, idle_minutes=minutes, down=args.down,
                                  wait_for=args.wait_for, cancel=args.cancel) for n in names]


def main(client: Client, args: argparse.Namespace) -> int:
    names, code = pick(client, args)
    ask(args, names, args.all or any(is_pattern(w) for w in args.clusters))
    verbose = bool(getattr(args, "verbose", False))  # `start -v`
    printers = [Printer(verbose) for _ in names]  # one per cluster: each has its phases

    def on_event(index: int, event: str, data: dict[str, Any]) -> None:
        if args.verb != "autostop":  # its request has nothing to say along the way
            printers[index].event(event, data, {}, prefix=f"[{names[index]}] ")

    results = client.call_many(requests_for(args, names), on_event=on_event)
    for name, result in zip(names, results, strict=True):
        if isinstance(result, ClusterdError):
            code = worse(code, report(name, result))
        else:
            print(done_line(args.verb, name, result))
    for name, printer in zip(names, printers, strict=True):
        printer.phases(prefix=f"[{name}] ")
    return code


def done_line(verb: str, name: str, result: dict[str, Any]) -> str:
    if verb == "autostop":
        setting = result.get("autostop")
        if setting is None:
            return f"Autostop of {name} cancelled."
        action = "tear it down" if setting["down"] else "stop it"
        return (f"{name}: will {action} after {setting['idle_minutes']:g} idle minutes "
                f"(busy means: {setting['wait_for'].replace('_', ' ')}).")
    done = DONE[verb]
    if verb == "stop" and not result.get("changed", True):
        done = "already stopped"
    return f"Cluster {name} {done}."
