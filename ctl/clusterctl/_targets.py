"""Which clusters a command acts on: names, shell-style globs (`'dev-*'`) and `-a/--all`,
as `stop`, `down`, `start` and `autostop` take them (SkyPilot's `sky stop -a`, `sky down
'dev-*'`). Imported only by those verbs.

A cluster name never holds `*`, `?` or `[` (see INVALID_NAME), so a word with one is a
pattern. A pattern or `--all` picks among the clusters `status` lists, those in a status the
verb can act on, never a managed job's cluster (its job owns it: `jobs cancel` takes it
down); a plain name is passed on as it is, for the daemon to act on or refuse."""

from __future__ import annotations

import fnmatch

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from collections.abc import Sequence
    from typing import Any

# The statuses a pattern or --all picks for each verb: what the verb can change.
PICKED: dict[str, tuple[str, ...]] = {
    "stop": ("UP", "INIT"),
    "start": ("STOPPED", "INIT"),
    "down": ("UP", "INIT", "STOPPED"),
    "autostop": ("UP",),
}
GLOB_CHARS = frozenset("*?[")


def is_pattern(word: str) -> bool:
    return not GLOB_CHARS.isdisjoint(word)


class Targets:
    """What a command line picked: `names` to act on, in the order given (each once),
    `unmatched` patterns, and `skipped` managed jobs' clusters a pattern matched."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.unmatched: list[str] = []
        self.skipped: list[str] = []


def resolve(verb: str, words: Sequence[str], every: bool,
            clusters: Sequence[dict[str, Any]]) -> Targets:
    """`words` (names and patterns) and `every` (--all), against `clusters` (status views)."""
    targets = Targets()
    picked = PICKED[verb]
    eligible = []
    for cluster in clusters:
        if cluster.get("managed_job") is not None:
            if every or any(is_pattern(w) and fnmatch.fnmatchcase(cluster["name"], w)
                            for w in words):
                targets.skipped.append(cluster["name"])
            continue
        if cluster["status"] in picked:
            eligible.append(cluster["name"])
    chosen: dict[str, None] = {}
    if every:
        chosen.update(dict.fromkeys(eligible))
    for word in words:
        if not is_pattern(word):
            chosen[word] = None
            continue
        matched = [name for name in eligible if fnmatch.fnmatchcase(name, word)]
        if not matched:
            targets.unmatched.append(word)
        chosen.update(dict.fromkeys(matched))
    targets.names = list(chosen)
    return targets
