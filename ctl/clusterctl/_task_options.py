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


def add_run_options(parser: argparse.ArgumentParser, verb: str) -> None:
    """SkyPilot's flags of `launch` and `exec` (protocol.RunArgs): each overrides the task
    file's field (docs/skypilot-compatibility.md, "Command-line flags")."""
    import argparse  # what parses the command line has it already

    add = parser.add_argument
    add("--memory", metavar="GB", help="override the task's memory per node, e.g. 32 or 32+")
    add("--gpus", metavar="NAME[:COUNT]",
        help="override the task's accelerators per node, e.g. A100:2 (A100: one)")
    add("--instance-type", metavar="TYPE", help="override the task's instance type")
    add("--use-spot", action=argparse.BooleanOptionalAction, default=None,
        help="override the task's use_spot")
    add("--disk-size", type=int, metavar="GB", help="override the task's disk size (GB)")
    add("--ports", action="append", metavar="PORT",
        help="override the task's ports: 8080 or 10000-10010 (repeatable)")
    add("--image-id", metavar="IMAGE", help="override the task's image_id")
    add("--workdir", metavar="DIR", help="override the task's workdir (a local directory)")
    add("--env-file", metavar="FILE",
        help="set the task's environment from a dotenv file (K=V lines); --env wins over it")
    add("--dryrun", action="store_true",
        help="print the plan (placement, price, what would be synced) and make nothing")
    add("--json", action="store_true", help="with --dryrun: the plan as JSON")
    if verb == "launch":
        add("--no-setup", action="store_true", help="skip the task's setup")
        add("-y", "--yes", action="store_true",
            help="accepted for SkyPilot's sake: launch never asks")
        add("--fast", action="store_true",
            help="accepted for SkyPilot's sake: a relaunch of an UP cluster already skips "
                 "what is done (add --no-setup to skip the setup too)")


def dotenv_values(path: str) -> dict[str, str]:
    """A dotenv file, as SkyPilot's --env-file reads it: `K=V` lines (or `export K=V`);
    values as written, in single quotes, or in double quotes with backslash escapes (\\n, \\",
    \\\\); `#` comments on lines of their own and after an unquoted value. Read after the
    command line is parsed, never while (see _argv_cache)."""
    try:
        with open(path, encoding="utf-8") as file:
            lines = file.read().splitlines()
    except (OSError, UnicodeDecodeError) as exc:
        fail(f"--env-file {clipped(path, 60)}: cannot read it: "
             f"{getattr(exc, 'strerror', None) or exc}")
    values: dict[str, str] = {}
    for number, line in enumerate(lines, 1):
        text = line.strip()
        if not text or text.startswith("#"):
            continue
        if text.startswith("export "):
            text = text[len("export "):].lstrip()
        key, sep, value = text.partition("=")
        key = key.strip()
        if not sep or not _env_name(key):
            fail(f"--env-file {clipped(path, 60)}, line {number}: expected NAME=VALUE",
                 "names are letters, digits and _; comments start with #")
        values[key] = _dotenv_value(value.strip())
    return values


def _env_name(key: str) -> bool:
    return (key.isascii() and key.replace("_", "a").isalnum() and not key[0].isdigit())


_ESCAPES = {"n": "\n", "t": "\t", '"': '"', "\\": "\\"}


def _dotenv_value(text: str) -> str:
    if len(text) >= 2 and text[0] == text[-1] == "'":
        return text[1:-1]
    if len(text) >= 2 and text[0] == text[-1] == '"':
        out: list[str] = []
        chars = iter(text[1:-1])
        for char in chars:
            if char == "\\":
                escaped = next(chars, "")
                char = _ESCAPES.get(escaped, "\\" + escaped)
            out.append(char)
        return "".join(out)
    value, _, _ = text.partition(" #")
    return value.rstrip()


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


def run_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The RunArgs of `launch`/`exec`'s flags (those a verb lacks keep their defaults)."""
    return {
        "memory": args.memory, "gpus": args.gpus, "instance_type": args.instance_type,
        "use_spot": args.use_spot, "disk_size": args.disk_size, "ports": args.ports,
        "image_id": args.image_id, "workdir": args.workdir, "dryrun": args.dryrun,
        "no_setup": getattr(args, "no_setup", False),
    }


def task_args(args: argparse.Namespace, cls: type[Any], **extra: Any) -> Any:
    entry = list(args.entrypoint or [])
    command_given = getattr(args, "command_given", False)
    if entry and not command_given:
        _refuse_what_is_no_task(entry)
    source: dict[str, Any] = {}
    if len(entry) == 1 and entry[0].endswith(YAML_SUFFIXES) and not command_given:
        source["yaml_path"] = os.path.abspath(entry[0])
    elif entry:
        source["command"] = " ".join(entry)
    elif cls is protocol.ExecArgs:
        fail("exec needs a task YAML or a command", "e.g. clusterctl exec CLUSTER -- echo hi")
    envs = key_values(args.env, "--env")
    if issubclass(cls, protocol.RunArgs):
        extra = {**run_overrides(args), **extra}
        if args.env_file:
            envs = {**dotenv_values(args.env_file), **envs}  # --env wins, as in SkyPilot
    return cls(
        cwd=os.getcwd(),
        envs=envs,
        secrets=key_values(args.secret, "--secret"),
        num_nodes=args.num_nodes,
        cpus=args.cpus,
        detach=args.detach,
        name=args.name,
        strict=args.strict,
        **source,
        **extra,
    )
