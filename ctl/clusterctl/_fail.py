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
