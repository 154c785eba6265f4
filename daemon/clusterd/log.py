"""structlog set-up shared by the daemon and the agent: JSON lines, one per event.

Request ids and cluster names are bound with `bind_contextvars` where a request starts, so every
line logged while serving it carries them.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog

from clusterd.redact import redact_urls

LEVELS = ("debug", "info", "warning", "error")


def _drop_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # Belt and braces: nothing named like a secret is ever written, whatever a caller passes,
    # and no credentials written into a URL (https://user:token@host).
    for key, value in list(event.items()):
        if "secret" in key.lower() or "token" in key.lower():
            event[key] = "<redacted>"
        elif isinstance(value, str) and "@" in value:
            event[key] = redact_urls(value)
    return event


def configure(level: str = "info", path: Path | None = None, stream: TextIO | None = None) -> None:
    if level not in LEVELS:
        raise SystemExit(f"unknown log level {level!r}; choose one of {', '.join(LEVELS)}")
    out: TextIO = stream or sys.stderr
    if path is not None:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        os.fchmod(fd, 0o600)  # one written by an older clusterd may be 0644
        out = open(fd, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives as long as the process
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            _drop_secrets,
            structlog.processors.format_exc_info,
            structlog.processors.JSONRenderer(),
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> Any:
    return structlog.get_logger(name)
