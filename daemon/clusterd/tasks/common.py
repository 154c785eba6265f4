"""What every part of the task loader shares: its error (naming the file and the field) and
how values are shown in it, and how paths are filled from envs and made absolute."""

from __future__ import annotations

import os
import string
from collections.abc import Mapping
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError, clipped


class TaskError(ProtocolError):
    def __init__(self, source: str, field: str, message: str, hint: str = "") -> None:
        where = f"{source}: {field}: " if field else f"{source}: "
        super().__init__(ErrorCode.INVALID_TASK, where + message, hint)


def kind(value: Any) -> str:
    names = {dict: "a map", list: "a list", str: "a string", bool: "a boolean",
             int: "a number", float: "a number", type(None): "nothing"}
    return names.get(type(value), type(value).__name__)


def shown(value: Any, limit: int = 60) -> str:
    return clipped(repr(value), limit)


def local_path(value: str, cwd: str) -> str:
    return os.path.normpath(os.path.join(cwd, os.path.expanduser(value)))


def expand(text: str, envs: Mapping[str, str]) -> str:
    """SkyPilot fills `${VAR}` and `$VAR` in paths from the task's envs (after --env)."""
    return string.Template(text).safe_substitute(envs)
