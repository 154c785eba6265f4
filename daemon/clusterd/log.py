"""structlog set-up shared by the daemon and the agent: JSON lines, one per event.

Request ids and cluster names are bound with `bind_contextvars` where a request starts, so every
line logged while serving it carries them.

A line that carries a key with a sink (`tee`) is also handed, rendered the same, to that sink:
the managed-jobs controller keeps each job's own lines beside the job's log this way.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
from collections.abc import Callable, MutableMapping
from pathlib import Path
from typing import Any, TextIO

import structlog

from clusterd.redact import redact_urls, redact_values

LEVELS = ("debug", "info", "warning", "error")

# key -> what gets (the key's value, the line) of every line that carries the key.
Sink = Callable[[Any, str], None]
_sinks: dict[str, Sink] = {}
_render = structlog.processors.JSONRenderer()


def tee(key: str, sink: Sink | None) -> None:
    """From now on, give `sink` every line (after redaction, as JSON) whose event or bound
    context has `key`; None stops that. A sink must be quick and must not log."""
    if sink is None:
        _sinks.pop(key, None)
    else:
        _sinks[key] = sink


def _tee(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    for key, sink in list(_sinks.items()):
        value = event.get(key)
        if value is None:
            continue
        # A sink's failure (a full disk) must not cost the daemon log its line.
        with contextlib.suppress(Exception):
            sink(value, str(_render(None, "", dict(event))))
    return event


def _drop_secrets(_: Any, __: str, event: MutableMapping[str, Any]) -> MutableMapping[str, Any]:
    # Belt and braces: nothing named like a secret is ever written, whatever a caller passes,
    # and no credentials written into a URL (https://user:token@host).
    for key, value in list(event.items()):
        if "secret" in key.lower() or "token" in key.lower():
            event[key] = "<redacted>"
        elif isinstance(value, str) and "@" in value:
            event[key] = redact_urls(value)
        elif isinstance(value, (list, dict)):
            event[key] = redact_values(value)
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
            _tee,
            _render,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(getattr(logging, level.upper())),
        logger_factory=structlog.PrintLoggerFactory(out),
        cache_logger_on_first_use=True,
    )


def get(name: str) -> Any:
    return structlog.get_logger(name)
