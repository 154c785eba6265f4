"""`clusterctl completion bash|zsh|fish`: a shell completion script made from the argparse
parser itself, so every verb, action, option and choice clusterctl has is completed, and a new
one needs no completion code of its own.

The parser is walked into a `Grammar` (_completion_grammar.py), which _completion_scripts.py
writes as each shell's tables, beside one fixed function per shell that reads them. Cluster
names come from `clusterctl completion --cluster-names` (one status call; never starts
clusterd). Imported only when `completion` runs."""

from __future__ import annotations

import sys

from clusterctl import _exit_codes

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    import argparse
    from collections.abc import Callable

SHELLS = ("bash", "zsh", "fish")


def add_options(completion: argparse.ArgumentParser) -> None:
    completion.description = (
        "Prints a completion script for your shell, made from clusterctl's own parser. "
        "bash: `source <(clusterctl completion bash)` in ~/.bashrc; zsh (after compinit): "
        "`source <(clusterctl completion zsh)` in ~/.zshrc; fish: `clusterctl completion "
        "fish > ~/.config/fish/completions/clusterctl.fish`. Cluster names are completed "
        "from a running clusterd (the scripts never start one).")
    one = completion.add_mutually_exclusive_group(required=True)
    one.add_argument("shell", nargs="?", choices=SHELLS)
    one.add_argument("--cluster-names", action="store_true",
                     help="print your clusters' names, one a line (what the scripts complete "
                          "names with); never starts clusterd")


def cluster_names(args: argparse.Namespace) -> int:
    """Each cluster's name on a line, from a clusterd that answers (none started for it)."""
    from clusterctl import protocol
    from clusterctl.client import Client, ClusterdError

    try:
        with Client(args.socket, autostart=False) as client:
            result = client.call(protocol.StatusArgs(columns=True))
    except (ClusterdError, OSError):
        return _exit_codes.ERROR  # a completion offers no names; it says nothing
    for view in protocol.views_of(result.get("clusters", [])):
        print(view["name"])
    return _exit_codes.SUCCEEDED


def main(args: argparse.Namespace, build_parser: Callable[[], argparse.ArgumentParser]) -> int:
    """The script for `args.shell` of the parser `build_parser` makes (clusterctl's whole
    parser; given, not imported: the parser imports this module for its options)."""
    if args.cluster_names:
        return cluster_names(args)
    from clusterctl._completion_grammar import grammar
    from clusterctl._completion_scripts import SCRIPTS

    sys.stdout.write(SCRIPTS[args.shell](grammar(build_parser())))
    return _exit_codes.SUCCEEDED
