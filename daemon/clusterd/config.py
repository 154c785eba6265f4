"""Daemon settings: defaults, overridden by environment variables (CLUSTERD_*) and flags."""

from __future__ import annotations

import dataclasses
import math
import os
from pathlib import Path
from typing import Any

from clusterctl import paths


def setting(default: Any, env: str, *, maximum: float = 1e9) -> Any:
    """A field of Settings: its default and the environment variable that overrides it,
    written once (here) and read by `Settings.from_env`. Numbers must be from 0 to `maximum`;
    a bool is set by "1"."""
    return dataclasses.field(default=default, metadata={"env": env, "maximum": maximum})


def _from_env(name: str, value: str, default: Any, maximum: float) -> Any:
    if isinstance(default, bool):
        return value == "1"
    if isinstance(default, str):
        return value
    try:
        number = float(value)
    except ValueError:
        raise SystemExit(f"clusterd: {name}={value!r} is not a number") from None
    if not math.isfinite(number) or number < 0 or number > maximum:
        raise SystemExit(f"clusterd: {name}={value!r} must be a number from 0 to {maximum:g}")
    return int(number) if isinstance(default, int) else number


@dataclasses.dataclass(frozen=True)
class Settings:
    socket_path: Path
    runtime_dir: Path
    state_dir: Path
    config_dir: Path
    log_level: str = setting("info", "CLUSTERD_LOG_LEVEL")
    # How long a request may wait for a cluster's lock before it fails with LOCK_TIMEOUT.
    lock_timeout_s: float = setting(1800.0, "CLUSTERD_LOCK_TIMEOUT")
    # After this long waiting, a request tells its client what it is blocked by.
    blocked_notice_s: float = setting(1.0, "CLUSTERD_BLOCKED_NOTICE")
    # Bound on in-flight request handling during shutdown before they are cancelled.
    shutdown_grace_s: float = 3.0
    # Object store of Ray on local clusters, in bytes (Ray's minimum is 75 MB).
    local_object_store_bytes: int = setting(200 * 1024 * 1024, "CLUSTERD_LOCAL_OBJECT_STORE_BYTES")
    # How long to wait for a cluster's runtime (Ray + agent) to come up.
    runtime_start_timeout_s: float = setting(120.0, "CLUSTERD_RUNTIME_START_TIMEOUT")
    # The refresh loop's period (each cycle waits this ± 10 %).
    refresh_interval_s: float = setting(30.0, "CLUSTERD_REFRESH_INTERVAL")
    # How often the budget controller looks at each budget's spend (docs/budgets.md).
    budget_poll_s: float = setting(30.0, "CLUSTERD_BUDGET_POLL")
    # How often autostop deadlines are checked: a timer fires at most this late.
    autostop_check_s: float = setting(5.0, "CLUSTERD_AUTOSTOP_CHECK")
    # How often the idle-cost guard asks an idle cluster with no autostop how long it has
    # been idle, and looks for clusters to guard (cost/idle_guard.py).
    idle_warning_check_s: float = setting(30.0, "CLUSTERD_IDLE_WARNING_CHECK")
    # How long past an autostop deadline, with no daemon in reach, an agent waits before it
    # stops its cluster on its own.
    agent_autostop_grace_s: float = setting(300.0, "CLUSTERD_AGENT_AUTOSTOP_GRACE")
    # `launch --retry-until-up`: the first wait between rounds, growing 1.5x up to the cap.
    retry_gap_s: float = setting(10.0, "CLUSTERD_RETRY_GAP")
    retry_max_gap_s: float = setting(300.0, "CLUSTERD_RETRY_MAX_GAP")
    # After a daemon restart, unfinished managed jobs are brought back this many at a time,
    # their starts spread over up to this many seconds (control/restart.py).
    restart_limit: int = setting(8, "CLUSTERD_RESTART_LIMIT", maximum=10_000)
    restart_spread_max_s: float = setting(30.0, "CLUSTERD_RESTART_SPREAD_MAX")
    # How long new nodes may take to run and answer SSH before the attempt counts as failed.
    provision_wait_s: float = setting(900.0, "CLUSTERD_PROVISION_WAIT")
    # A client connection with no request in flight for this long is closed.
    idle_timeout_s: float = setting(600.0, "CLUSTERD_IDLE_TIMEOUT")
    # Client connections served at once (0: derived from the open-files limit); more are
    # told TOO_MANY_CONNECTIONS and closed.
    max_connections: int = setting(0, "CLUSTERD_MAX_CONNECTIONS")
    # Records the daemon keeps of finished requests (`requests --all`); older ones go.
    request_retention: int = setting(5_000, "CLUSTERD_REQUEST_RETENTION")
    # The cost ledger keeps torn-down clusters' intervals this many days after they ended
    # (400: a yearly report still adds up); open ones, and live clusters', always.
    cost_retention_days: float = setting(400.0, "CLUSTERD_COST_RETENTION_DAYS", maximum=1e5)
    # Job records (with their logs) each cluster's agent keeps; older finished ones go.
    agent_job_retention: int = setting(1_000, "CLUSTERD_AGENT_JOB_RETENTION")
    # Kept copies of jobs' logs on this machine (keptlogs/): at most this much per job (0:
    # none are kept) and per cluster, the oldest part (or oldest jobs' copies) dropped first;
    # how often running jobs' logs are copied, how long teardown's last copy may take, and
    # how many torn-down clusters the history keeps (with their copies).
    kept_log_job_bytes: int = setting(100_000_000, "CLUSTERD_KEPT_LOG_JOB_BYTES", maximum=1e15)
    kept_log_cluster_bytes: int = setting(1_000_000_000, "CLUSTERD_KEPT_LOG_CLUSTER_BYTES",
                                          maximum=1e15)
    kept_log_interval_s: float = setting(2.0, "CLUSTERD_KEPT_LOG_INTERVAL")
    kept_log_last_round_s: float = setting(30.0, "CLUSTERD_KEPT_LOG_LAST_ROUND")
    kept_history: int = setting(500, "CLUSTERD_KEPT_HISTORY", maximum=1e6)
    # A task's copy (workdir, file mount) sending more than this is warned of (refused under
    # --strict).
    sync_warn_bytes: int = setting(1_000_000_000, "CLUSTERD_SYNC_WARN_BYTES", maximum=1e15)
    # Where a node with no usable Python gets a uv-managed CPython (node_platform.PythonSource):
    # a mirror of python-build-standalone's releases (uv's --mirror), or a JSON list of
    # downloads with their digests (uv's --python-downloads-json-url). Empty: uv's default.
    python_mirror: str = setting("", "CLUSTERD_PYTHON_MIRROR")
    python_downloads_json_url: str = setting("", "CLUSTERD_PYTHON_DOWNLOADS_JSON_URL")
    # Runtime wheelhouses kept here instead of under the state directory: one shared by
    # several daemons, or made before the daemon runs somewhere without the package index.
    shared_wheelhouse_dir: str = setting("", "CLUSTERD_WHEELHOUSE_DIR")
    # A catalog in SkyPilot's CSV format (DIR/aws/vms.csv), before the config's catalog_dir.
    catalog_dir: str = setting("", "CLUSTERD_CATALOG_DIR")
    # The image of Kubernetes pods where neither the task nor the config names one (a test
    # bed's `exec` sets it).
    kubernetes_image: str = setting("", "CLUSTERD_KUBERNETES_IMAGE")
    # Benchmarks only: providers made for them (comma-separated; see providers/loadtest.py),
    # and the load-test provider's zones and whether every zone is out of stock.
    test_providers: str = setting("", "CLUSTERD_TEST_PROVIDERS")
    loadtest_zones: int = setting(1, "CLUSTERD_LOADTEST_ZONES")
    loadtest_stockout: bool = setting(False, "CLUSTERD_LOADTEST_STOCKOUT")

    @property
    def db_path(self) -> Path:
        return self.state_dir / "state.db"

    @property
    def wheelhouse_dir(self) -> Path:
        """Where runtime wheelhouses are kept (see shared_wheelhouse_dir)."""
        if self.shared_wheelhouse_dir:
            return Path(self.shared_wheelhouse_dir)
        return self.state_dir / "wheelhouse"

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
        """Every setting's default, overridden by its environment variable if that is set
        and not empty, then by `overrides` (flags) that are not None."""
        # Absolute now: the daemon's directory becomes / before the socket is made.
        socket_path = Path(paths.socket_path()).absolute()
        values: dict[str, object] = {
            "socket_path": socket_path,
            "runtime_dir": socket_path.parent,
            "state_dir": Path(paths.state_dir()),
            "config_dir": Path(paths.config_dir()),
        }
        for field in dataclasses.fields(cls):
            name = field.metadata.get("env")
            raw = os.environ.get(name) if name else None
            if name and raw:
                values[field.name] = _from_env(name, raw, field.default,
                                               field.metadata["maximum"])
        values.update({k: v for k, v in overrides.items() if v is not None})
        return cls(**values)  # type: ignore[arg-type]
