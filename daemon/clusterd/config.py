"""Daemon settings: defaults, overridden by environment variables (CLUSTERD_*) and flags."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path

from clusterctl import paths


def _float_env(name: str, default: float, maximum: float = 1e9) -> float:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    try:
        number = float(value)
    except ValueError:
        raise SystemExit(f"clusterd: {name}={value!r} is not a number") from None
    if not math.isfinite(number) or number < 0 or number > maximum:
        raise SystemExit(f"clusterd: {name}={value!r} must be a number from 0 to {maximum:g}")
    return number


@dataclasses.dataclass(frozen=True)
class Settings:
    socket_path: Path
    runtime_dir: Path
    state_dir: Path
    config_dir: Path
    log_level: str = "info"
    # How long a request may wait for a cluster's lock before it fails with LOCK_TIMEOUT.
    lock_timeout_s: float = 1800.0
    # After this long waiting, a request tells its client what it is blocked by.
    blocked_notice_s: float = 1.0
    # Bound on in-flight request handling during shutdown before they are cancelled.
    shutdown_grace_s: float = 3.0
    # Object store of Ray on local clusters, in bytes (Ray's minimum is 75 MB).
    local_object_store_bytes: int = 200 * 1024 * 1024
    # How long to wait for a cluster's runtime (Ray + agent) to come up.
    runtime_start_timeout_s: float = 120.0
    # The refresh loop's period (each cycle waits this ± 10 %).
    refresh_interval_s: float = 30.0
    # How often autostop deadlines are checked: a timer fires at most this late.
    autostop_check_s: float = 5.0
    # How long past an autostop deadline, with no daemon in reach, an agent waits before it
    # stops its cluster on its own.
    agent_autostop_grace_s: float = 300.0
    # `launch --retry-until-up`: the first wait between rounds, growing 1.5x up to the cap.
    retry_gap_s: float = 10.0
    retry_max_gap_s: float = 300.0
    # How long new nodes may take to run and answer SSH before the attempt counts as failed.
    provision_wait_s: float = 900.0
    # A client connection with no request in flight for this long is closed.
    idle_timeout_s: float = 600.0
    # Client connections served at once (0: derived from the open-files limit); more are
    # told TOO_MANY_CONNECTIONS and closed.
    max_connections: int = 0
    # Records the daemon keeps of finished requests (`requests --all`); older ones go.
    request_retention: int = 5_000
    # Job records (with their logs) each cluster's agent keeps; older finished ones go.
    agent_job_retention: int = 1_000
    # A task's copy (workdir, file mount) sending more than this is warned of (refused under
    # --strict).
    sync_warn_bytes: int = 1_000_000_000
    # Where a node with no usable Python gets a uv-managed CPython (node_platform.PythonSource):
    # a mirror of python-build-standalone's releases (uv's --mirror), or a JSON list of
    # downloads with their digests (uv's --python-downloads-json-url). Empty: uv's default.
    python_mirror: str = ""
    python_downloads_json_url: str = ""

    @property
    def db_path(self) -> Path:
        return self.state_dir / "state.db"

    @property
    def wheelhouse_dir(self) -> Path:
        """Where runtime wheelhouses are kept (CLUSTERD_WHEELHOUSE_DIR: one shared by several
        daemons, or made before the daemon runs somewhere without the package index)."""
        shared = os.environ.get("CLUSTERD_WHEELHOUSE_DIR")
        return Path(shared) if shared else self.state_dir / "wheelhouse"

    @property
    def never_copied(self) -> tuple[tuple[str, str], ...]:
        """clusterd's own directories, which no task copy may send to a node."""
        return (("clusterd's state directory", str(self.state_dir)),
                ("clusterd's runtime directory", str(self.runtime_dir)),
                ("clusterd's cache directory", paths.cache_dir()),
                ("clusterd's wheelhouse", str(self.wheelhouse_dir)),
                ("clusterd's configuration directory", str(self.config_dir)))

    @property
    def log_path(self) -> Path:
        return self.state_dir / "clusterd.log"

    @classmethod
    def from_env(cls, **overrides: object) -> Settings:
        # Absolute now: the daemon's directory becomes / before the socket is made.
        socket_path = Path(paths.socket_path()).absolute()
        values: dict[str, object] = {
            "socket_path": socket_path,
            "runtime_dir": socket_path.parent,
            "state_dir": Path(paths.state_dir()),
            "config_dir": Path(paths.config_dir()),
            "log_level": os.environ.get("CLUSTERD_LOG_LEVEL", "info"),
            "lock_timeout_s": _float_env("CLUSTERD_LOCK_TIMEOUT", 1800.0),
            "blocked_notice_s": _float_env("CLUSTERD_BLOCKED_NOTICE", 1.0),
            "local_object_store_bytes": int(
                _float_env("CLUSTERD_LOCAL_OBJECT_STORE_BYTES", 200 * 1024 * 1024)
            ),
            "runtime_start_timeout_s": _float_env("CLUSTERD_RUNTIME_START_TIMEOUT", 120.0),
            "refresh_interval_s": _float_env("CLUSTERD_REFRESH_INTERVAL", 30.0),
            "autostop_check_s": _float_env("CLUSTERD_AUTOSTOP_CHECK", 5.0),
            "agent_autostop_grace_s": _float_env("CLUSTERD_AGENT_AUTOSTOP_GRACE", 300.0),
            "retry_gap_s": _float_env("CLUSTERD_RETRY_GAP", 10.0),
            "retry_max_gap_s": _float_env("CLUSTERD_RETRY_MAX_GAP", 300.0),
            "provision_wait_s": _float_env("CLUSTERD_PROVISION_WAIT", 900.0),
            "idle_timeout_s": _float_env("CLUSTERD_IDLE_TIMEOUT", 600.0),
            "max_connections": int(_float_env("CLUSTERD_MAX_CONNECTIONS", 0)),
            "request_retention": int(_float_env("CLUSTERD_REQUEST_RETENTION", 5_000)),
            "agent_job_retention": int(_float_env("CLUSTERD_AGENT_JOB_RETENTION", 1_000)),
            "sync_warn_bytes": int(_float_env("CLUSTERD_SYNC_WARN_BYTES", 1_000_000_000,
                                                      maximum=1e15)),
            "python_mirror": os.environ.get("CLUSTERD_PYTHON_MIRROR", ""),
            "python_downloads_json_url": os.environ.get("CLUSTERD_PYTHON_DOWNLOADS_JSON_URL",
                                                        ""),
        }
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
