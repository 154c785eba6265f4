"""Where clusterd keeps its socket, state and configuration (XDG base directories).

Shared by the client and the daemon so both always agree on the socket path. Plain strings
(os.path), not pathlib: this runs on every start of clusterctl.
"""

from __future__ import annotations

import os

SOCKET_NAME = "clusterd.sock"


def _xdg(var: str, *fallback: str) -> str:
    value = os.environ.get(var)
    # The XDG spec says relative paths are invalid and must be ignored.
    if value and os.path.isabs(value):
        return value
    return os.path.join(os.path.expanduser("~"), *fallback)


def runtime_dir() -> str:
    """Socket and tunnel directory: ``$XDG_RUNTIME_DIR/clusterd``, else ``/tmp/clusterd-UID``."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    if base and os.path.isabs(base):
        return os.path.join(base, "clusterd")
    return f"/tmp/clusterd-{os.getuid()}"


def socket_path() -> str:
    return os.environ.get("CLUSTERD_SOCKET") or os.path.join(runtime_dir(), SOCKET_NAME)


def state_dir() -> str:
    return os.path.join(_xdg("XDG_STATE_HOME", ".local", "state"), "clusterd")


def cache_dir() -> str:
    return os.path.join(_xdg("XDG_CACHE_HOME", ".cache"), "clusterd")


def config_dir() -> str:
    return os.path.join(_xdg("XDG_CONFIG_HOME", ".config"), "clusterd")
