"""Where clusterd keeps its socket, state and configuration (XDG base directories).

Shared by the client and the daemon so both always agree on the socket path.
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET_NAME = "clusterd.sock"


def _xdg(var: str, fallback: Path) -> Path:
    value = os.environ.get(var)
    # The XDG spec says relative paths are invalid and must be ignored.
    return Path(value) if value and os.path.isabs(value) else fallback


def runtime_dir() -> Path:
    """Socket and tunnel directory: ``$XDG_RUNTIME_DIR/clusterd``, else ``/tmp/clusterd-UID``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        return Path(base) / "clusterd"
    return Path(f"/tmp/clusterd-{os.getuid()}")


def socket_path() -> Path:
    override = os.environ.get("CLUSTERD_SOCKET")
    return Path(override) if override else runtime_dir() / SOCKET_NAME


def state_dir() -> Path:
    return _xdg("XDG_STATE_HOME", Path.home() / ".local" / "state") / "clusterd"


def config_dir() -> Path:
    return _xdg("XDG_CONFIG_HOME", Path.home() / ".config") / "clusterd"
