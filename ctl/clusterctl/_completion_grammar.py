"""A command line's grammar, read off its argparse parser (for `clusterctl completion`): for
each command path ("clusterctl", "clusterctl jobs", ...) its subcommands and options (with their
help), the options that take a value, and what each value or positional argument completes to
(a slot: its choices, cluster names, files, or nothing). Nothing here knows clusterctl's verbs:
a verb, option or choice the parser gains is in the grammar with no other change."""

from __future__ import annotations

import argparse
import dataclasses

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    from collections.abc import Iterator

ROOT = "clusterctl"
# What a slot completes to, besides a list of words (its choices).
CLUSTERS, FILES, NOTHING = "@clusters", "@files", "@nothing"
REPEATED = "+"  # the slot key of a last positional that takes any number of words
# Arguments that name clusters (`cluster`, `clusters`, launch's `-c/--cluster`).
CLUSTER_DESTS = ("cluster", "clusters")
# Arguments that name files: the task (or command), the socket, and any whose name says so
# (`--workdir`, `--env-file`, `logs --sync-down DIR`...).
PATH_DESTS = ("entrypoint", "socket")
PATH_WORDS = ("file", "dir", "path")


@dataclasses.dataclass
class Grammar:
    """What each command path takes. Slot keys are "PATH|--flag" for an option's value,
    "PATH|N" for the Nth positional argument (from 1), "PATH|+" for those after the last."""

    subcommands: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    options: dict[str, list[tuple[str, str]]] = dataclasses.field(default_factory=dict)
    valued: dict[str, list[str]] = dataclasses.field(default_factory=dict)
    slots: dict[str, str] = dataclasses.field(default_factory=dict)

    @property
    def paths(self) -> list[str]:
        return list(self.options)


def _slot(action: argparse.Action) -> str:
    if action.choices:
        return " ".join(map(str, action.choices))
    if action.dest in CLUSTER_DESTS:
        return CLUSTERS
    if action.dest in PATH_DESTS or any(word in action.dest for word in PATH_WORDS):
        return FILES
    return NOTHING


def _help(action: argparse.Action) -> str:
    text = action.help if action.help and action.help != argparse.SUPPRESS else ""
    return " ".join(text.split())  # one line: it is a table cell in every shell


def _walk(parser: argparse.ArgumentParser, path: str) -> Iterator[tuple[str, argparse.Action]]:
    """Every action of `parser` and of the parsers below it, with its command path."""
    for action in parser._actions:
        yield path, action
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _walk(sub, f"{path} {name}")


def grammar(parser: argparse.ArgumentParser) -> Grammar:
    found = Grammar()
    positionals: dict[str, int] = {}
    for path, action in _walk(parser, ROOT):
        found.options.setdefault(path, [])
        if isinstance(action, argparse._SubParsersAction):
            found.subcommands[path] = [(choice.dest, _help(choice))
                                       for choice in action._choices_actions]
        elif action.option_strings:
            found.options[path] += [(flag, _help(action)) for flag in action.option_strings]
            if action.nargs != 0:  # store_true, --help, --version take none
                found.valued.setdefault(path, []).extend(action.option_strings)
                for flag in action.option_strings:
                    found.slots[f"{path}|{flag}"] = _slot(action)
        else:
            index = positionals[path] = positionals.get(path, 0) + 1
            found.slots[f"{path}|{index}"] = _slot(action)
            if action.nargs in ("*", "+", argparse.REMAINDER):
                found.slots[f"{path}|{REPEATED}"] = _slot(action)
    return found
