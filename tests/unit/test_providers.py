"""The providers as the daemon builds them: one list (providers/offered.py), each class
building its instance from the daemon's context, and the registry that names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.providers.base import ProviderContext
from clusterd.providers.offered import OFFERED, build_providers
from clusterd.providers.ssh import SSHProvider
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.user_config import UserConfig


def context(tmp_path: Path, recorded: dict[str, list[tuple[str, Any]]] | None = None
            ) -> ProviderContext:
    return ProviderContext(
        state_dir=tmp_path / "state", config_dir=tmp_path / "config",
        connections=SSHConnections(HostKeyStore(tmp_path / "known_hosts")),
        config=lambda: UserConfig(tmp_path / "config.yaml"), daemon_id="clusterd-test",
        recorded=lambda provider: (recorded or {}).get(provider, []))


def test_the_daemon_offers_each_listed_provider_once_in_the_listed_preference(
        tmp_path: Path) -> None:
    registry = build_providers(context(tmp_path))
    assert registry.names() == sorted(cls.name for cls in OFFERED) == ["aws", "local", "ssh"]
    assert sorted(registry.names(), key=registry.preference) == ["local", "ssh", "aws"]
    assert registry.preference("nowhere") > registry.preference("aws")
    assert "loadtest" not in registry.names()
    assert "loadtest" in build_providers(context(tmp_path), ["loadtest"]).names()


def test_a_planned_provider_and_an_unknown_one_are_refused_as_such(tmp_path: Path) -> None:
    registry = build_providers(context(tmp_path))
    with pytest.raises(ProtocolError) as planned:
        registry.get("kubernetes")
    assert (planned.value.code, planned.value.message, planned.value.hint) == (
        ErrorCode.UNSUPPORTED,
        "the kubernetes provider is not available in this version of clusterd",
        "available: aws, local, ssh")
    with pytest.raises(ProtocolError) as unknown:
        registry.get("gcp")
    assert (unknown.value.code, unknown.value.message) == (
        ErrorCode.INVALID_ARGUMENT, "unknown infra 'gcp'")


def test_the_ssh_provider_counts_the_hosts_its_recorded_clusters_hold(tmp_path: Path) -> None:
    host = {"host": "10.0.0.5", "port": 22, "user": "alice", "identity_file": None,
            "host_key_alias": None, "proxy_command": None, "strict_host_keys": False,
            "cpus": 4.0, "memory_gb": 15.6}
    built = build_providers(context(tmp_path, {"ssh": [("dev", {"pool": "p", "hosts": [host]})]}))
    ssh = built.get("ssh")
    assert isinstance(ssh, SSHProvider)
    assert ssh._taken() == {SSHTarget("10.0.0.5", 22, "alice"): "dev"}
