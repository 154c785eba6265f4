"""How a clusterctl command ends in an error: the message (and a hint) on stderr, and the exit
code that scripts test. Below `cli` and the `dashboard` verb it runs, so both use one copy."""

from __future__ import annotations

import sys

from clusterctl import _exit_codes, protocol
from clusterctl.client import ClusterdError

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import NoReturn


def fail(message: str, hint: str = "", code: int = _exit_codes.ERROR) -> NoReturn:
    sys.stderr.write(f"clusterctl: error: {message}\n")
    if hint:
        sys.stderr.write(f"hint: {hint}\n")
    sys.exit(code)


def fail_with(error: ClusterdError) -> NoReturn:
    code = _exit_codes.NOT_FOUND if error.code in protocol.NOT_FOUND_CODES else _exit_codes.ERROR
    first, newline, rest = error.message.partition("\n")
    fail(f"{first} [{error.code}]{newline}{rest}", error.hint, code)


def report(name: str, error: ClusterdError) -> int:
    """One cluster's error among several (the others go on): said on stderr, named; the
    exit code it is worth."""
    sys.stderr.write(f"clusterctl: error: {name}: {error.message} [{error.code}]\n")
    if error.hint:
        sys.stderr.write(f"hint: {error.hint}\n")
    return _exit_codes.NOT_FOUND if error.code in protocol.NOT_FOUND_CODES else _exit_codes.ERROR


def worse(code: int, other: int) -> int:
    """The worse of two outcomes of a command on several clusters: any error beats a
    not-found (102 tells a script that nothing else went wrong), and either beats success."""
    if _exit_codes.ERROR in (code, other):
        return _exit_codes.ERROR
    return max(code, other)
