"""What the commands that run a task share (`launch`, `exec`, `jobs launch`): the task's
options, and the request made of them; and `--json` output."""

from __future__ import annotations

import os
import sys

from clusterctl import protocol
from clusterctl._fail import fail
from clusterctl._text import clipped

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

YAML_SUFFIXES = (".yaml", ".yml")


def key_values(pairs: Sequence[str] | None, flag: str) -> dict[str, str]:
    """--env K=V; a bare --env K takes K's value from this shell's environment."""
    result: dict[str, str] = {}
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep:
            if key not in os.environ:
                fail(f"{flag} {key}: no value given and {key} is not set here",
                     f"use {flag} {key}=VALUE")
            value = os.environ[key]
        if not key:
            fail(f"{flag} {pair!r}: expected KEY=VALUE")
        result[key] = value
    return result


def add_task_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-d", "--detach", action="store_true",
                        help="submit the job and return without streaming its logs")
    parser.add_argument("--env", action="append", metavar="K=V",
                        help="set an environment variable for the task (repeatable)")
    parser.add_argument("--secret", action="append", metavar="K=V",
                        help="like --env, but never stored or shown (repeatable)")
    parser.add_argument("--num-nodes", type=int, help="override the task's num_nodes")
    parser.add_argument("--cpus", help="override the task's CPUs per node, e.g. 2 or 4+")
    parser.add_argument("--name", help="override the task's name")
    parser.add_argument("--strict", action="store_true",
                        help="refuse task fields that would have no effect (else: warnings)")
    parser.add_argument("entrypoint", nargs="*", metavar="TASK.yaml | COMMAND",
                        help="a SkyPilot task YAML, or a shell command to run (put it after "
                             "-- if it has options of its own)")


def _refuse_what_is_no_task(entry: list[str]) -> None:
    """A task file with words after it, or a directory, is neither a task nor a command
    anyone meant: refused, rather than run on the nodes as a command that fails there."""
    first = entry[0]
    shown = clipped(first, 40)
    if first.endswith(YAML_SUFFIXES) and len(entry) > 1:
        rest = " ".join(entry[1:])
        fail(f"{shown} is a task file, and a task file takes no arguments "
             f"(given: {rest if len(rest) <= 40 else rest[:37] + '...'})",
             "set the task's variables with --env K=V, or give a command after --")
    if len(entry) == 1 and os.path.isdir(first):
        fail(f"{shown} is a directory, not a task",
             f"give a task YAML (e.g. {shown.rstrip('/')}/task.yaml), or a command after --")


def print_json(value: Any) -> None:
    import json  # only for --json: most runs never need it

    sys.stdout.write(json.dumps(value, indent=2, sort_keys=True, default=str) + "\n")


def task_args(args: argparse.Namespace, cls: type[Any], **extra: Any) -> Any:
    entry = list(args.entrypoint or [])
    if entry and not getattr(args, "command_given", False):
        _refuse_what_is_no_task(entry)
    source: dict[str, Any] = {}
    if len(entry) == 1 and entry[0].endswith(YAML_SUFFIXES):
        source["yaml_path"] = os.path.abspath(entry[0])
    elif entry:
        source["command"] = " ".join(entry)
    elif cls is protocol.ExecArgs:
        fail("exec needs a task YAML or a command", "e.g. clusterctl exec CLUSTER -- echo hi")
    return cls(
        cwd=os.getcwd(),
        envs=key_values(args.env, "--env"),
        secrets=key_values(args.secret, "--secret"),
        num_nodes=args.num_nodes,
        cpus=args.cpus,
        detach=args.detach,
        name=args.name,
        strict=args.strict,
        **source,
        **extra,
    )
