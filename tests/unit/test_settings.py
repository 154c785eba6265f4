"""The daemon's settings: each default and its environment variable written once (a field of
Settings), read by Settings.from_env, and nowhere else in the daemon."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest

from clusterd.config import Settings

PACKAGE = Path(__file__).resolve().parents[2] / "daemon" / "clusterd"
# Modules that may read the environment themselves, and why.
READ_ELSEWHERE = {
    "config.py": "where the settings are read",
    "agent": "the node program, which reads its node's environment",
    "server/listener.py": "systemd's socket activation protocol (LISTEN_PID, LISTEN_FDS)",
    "providers/aws/ec2.py": "botocore's own AWS_EC2_METADATA_DISABLED",
    "storage/service.py": "AWS's own AWS_ENDPOINT_URL(_S3), which nodes are pointed at too",
    "providers/kubernetes/api.py": "kubectl's own KUBECONFIG",
    "providers/kubernetes/credentials.py": "an exec plugin runs with the daemon's environment",
    "providers/ssh_pools.py": "the login name (USER) an SSH pool defaults to, as ssh does",
    "user_config.py": "CLUSTERD_CONFIG, the config file, which is read again when it changes",
    "faults.py": "test fault points, armed at import, before any settings exist",
}


def base(**overrides: object) -> Settings:
    return Settings.from_env(socket_path=Path("/tmp/r/s.sock"), runtime_dir=Path("/tmp/r"),
                             state_dir=Path("/tmp/s"), config_dir=Path("/tmp/c"), **overrides)


def test_every_setting_with_a_variable_is_read_from_it(monkeypatch: pytest.MonkeyPatch) -> None:
    fields = [f for f in dataclasses.fields(Settings) if "env" in f.metadata]
    assert len(fields) > 20
    for field in fields:
        monkeypatch.delenv(field.metadata["env"], raising=False)
    defaults = base()
    for field in fields:
        assert getattr(defaults, field.name) == field.default, field.name
        value = {bool: "1", str: "x/y", int: "7", float: "2.5"}[type(field.default)]
        monkeypatch.setenv(field.metadata["env"], value)
    read = base()
    for field in fields:
        assert getattr(read, field.name) == {bool: True, str: "x/y", int: 7, float: 2.5}[
            type(field.default)], field.name
    assert read.wheelhouse_dir == Path("x/y")
    assert base(lock_timeout_s=9.0).lock_timeout_s == 9.0  # a flag beats the variable


def test_an_empty_variable_keeps_the_default_and_a_bad_one_stops_the_daemon(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CLUSTERD_LOG_LEVEL", "")
    monkeypatch.delenv("CLUSTERD_WHEELHOUSE_DIR", raising=False)
    assert base().log_level == "info"
    assert base().wheelhouse_dir == Path("/tmp/s/wheelhouse")
    for bad in ("soon", "-1", "nan", "1e10"):
        monkeypatch.setenv("CLUSTERD_LOCK_TIMEOUT", bad)
        with pytest.raises(SystemExit, match="CLUSTERD_LOCK_TIMEOUT"):
            base()


def test_no_other_module_of_the_daemon_reads_the_environment() -> None:
    readers = sorted(
        str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
        if re.search(r"os\.environ|os\.getenv", path.read_text())
        and not any(str(path.relative_to(PACKAGE)).startswith(allowed)
                    for allowed in READ_ELSEWHERE))
    assert readers == [], "read the setting in config.Settings instead"
