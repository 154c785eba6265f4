"""Command lines clusterctl has parsed, kept: a command line run again skips argparse.

argparse and what it imports (re, enum, gettext) are 3-4 ms of a 20 ms `clusterctl status`,
building the verb's parser and parsing another 0.7 ms. What a command line parses to depends
on its words and clusterctl's code only (no option reads the environment or a file while it
is parsed: a bare `--env K` is looked up afterwards), so each one parsed is kept with the
fingerprint of the code that parsed it (each module's size and mtime, clusterctl's version,
Python's), and a later run with the same words and the same code takes the kept result.
A command line that failed to parse or asked for help or the version (argparse exits) is never
kept, nor one whose values msgpack would not give back as they were, nor `dashboard` (a
server: its start is not worth a cached parse) or `ssh` (its connection is; and a command
typed for a remote shell may hold anything), nor one that may carry a secret (`--secret`,
`GIT_TOKEN`, a URL with credentials in it): secrets are never at rest, and a parse is not
worth the risk.

The file is in clusterd's private cache directory (0700, checked as the socket's is), replaced
whole by a rename; a file that is missing, unreadable or not what this module writes is a miss,
never an error.
"""

from __future__ import annotations

import os
import sys
from types import SimpleNamespace

import msgpack

from clusterctl import paths
from clusterctl._private import (
    UnsafePath,
    check_private_dir,
    ensure_private_dir,
    write_private_file,
)
from clusterctl._version import __version__

FILE_NAME = "argv.msgpack"
MAX_LINES = 64  # the most recent command lines parsed, not every one ever typed
NOT_KEPT_VERBS = ("dashboard", "ssh")
# Words that make a command line one never kept (see _may_carry_a_secret).
SECRET_WORDS = ("--secret", "GIT_TOKEN")
_PACKAGE = os.path.dirname(os.path.abspath(__file__))

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any


def path() -> str:
    return os.path.join(paths.cache_dir(), FILE_NAME)


def _fingerprint() -> list[Any]:
    """What the parse depends on besides the words: the code of every module of clusterctl
    (the verbs' options live in several), by size and mtime (a stat each: ~30 µs for all)."""
    parts: list[Any] = [__version__, sys.version]
    for name in sorted(os.listdir(_PACKAGE)):
        if name.endswith(".py"):
            info = os.stat(os.path.join(_PACKAGE, name))
            parts.append([name, info.st_size, info.st_mtime_ns])
    return parts


def _read(fingerprint: list[Any]) -> dict[str, dict[str, Any]]:
    try:
        check_private_dir(paths.cache_dir())  # nobody else's, and nobody else may write there
        fd = os.open(path(), os.O_RDONLY | os.O_NOFOLLOW)
    except (OSError, UnsafePath):
        return {}
    try:
        with os.fdopen(fd, "rb") as f:  # closes the descriptor on every way out
            if os.fstat(f.fileno()).st_uid != os.getuid():
                return {}
            kept = msgpack.unpackb(f.read(), raw=False)
    except (OSError, ValueError, msgpack.UnpackException):
        return {}
    if not isinstance(kept, dict) or kept.get("fingerprint") != fingerprint:
        return {}
    lines = kept.get("lines")
    return lines if isinstance(lines, dict) else {}


def _key(words: Sequence[str]) -> str:
    return "\0".join(words)


def recall(words: Sequence[str]) -> argparse.Namespace | None:
    """What `words` parsed to when clusterctl (this code) parsed them last; None if it has
    not, or nothing kept can be trusted to be that."""
    values = _read(_fingerprint()).get(_key(words))
    if not isinstance(values, dict) or not all(isinstance(k, str) for k in values):
        return None
    # The commands read attributes (and vars()) only: a SimpleNamespace does, without argparse.
    return SimpleNamespace(**values)  # type: ignore[return-value]


def _plain(value: Any) -> bool:
    """Given back by msgpack as it is (a tuple would come back a list)."""
    if value is None or isinstance(value, (str, bool, int, float)):
        return True
    return isinstance(value, list) and all(_plain(item) for item in value)


def _has_url_credentials(word: str) -> bool:
    """`scheme://USERINFO@host...` anywhere in `word` (string methods, not `re`: its import
    is a cost of every run). A false alarm costs a parse, never a leak."""
    return any("@" in part.split("/", 1)[0] for part in word.split("://")[1:])


def _may_carry_a_secret(words: Sequence[str], values: dict[str, Any]) -> bool:
    # The parsed `secret` catches what the words may spell otherwise (`--sec`, `--secret=`).
    if values.get("secret"):
        return True
    return any(marker in word for word in words for marker in SECRET_WORDS) \
        or any(map(_has_url_credentials, words))


def keep(words: Sequence[str], parsed: argparse.Namespace) -> None:
    """Remember what `words` parsed to, for the next run (best effort: a cache that cannot be
    written costs only the parse). A command line that may carry a secret is never kept."""
    values = vars(parsed)
    if values.get("verb") in NOT_KEPT_VERBS or not all(map(_plain, values.values())) \
            or _may_carry_a_secret(words, values):
        return
    fingerprint = _fingerprint()
    lines = _read(fingerprint)
    lines.pop(_key(words), None)
    lines[_key(words)] = values  # last: the oldest are first, and dropped first
    for stale in list(lines)[:-MAX_LINES]:
        del lines[stale]
    try:
        ensure_private_dir(paths.cache_dir())
        write_private_file(path(), msgpack.packb({"fingerprint": fingerprint, "lines": lines}))
    except (OSError, UnsafePath):
        pass
