"""The providers as the daemon builds them: one list (providers/offered.py), each class
building its instance from the daemon's context, and the registry that names them."""

from __future__ import annotations

from pathlib import Path
from typing import Any, ClassVar

import pytest

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.config import Settings
from clusterd.nodes import SSHTarget
from clusterd.providers.base import ProviderContext, ProviderDefaults
from clusterd.providers.local import LocalProvider
from clusterd.providers.offered import OFFERED, TEST_ONLY, build_providers
from clusterd.providers.registry import ProviderRegistry
from clusterd.providers.ssh import SSHHandle, SSHHost, SSHProvider
from clusterd.server.handlers import Handlers
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.tasks import fields
from clusterd.tasks.spec import Resources
from clusterd.user_config import UserConfig


def context(tmp_path: Path, recorded: dict[str, list[tuple[str, Any]]] | None = None
            ) -> ProviderContext:
    return ProviderContext(
        state_dir=tmp_path / "state", runtime_dir=tmp_path / "run", config_dir=tmp_path / "config",
        connections=SSHConnections(HostKeyStore(tmp_path / "known_hosts")),
        config=lambda: UserConfig(tmp_path / "config.yaml"), daemon_id="clusterd-test",
        recorded=lambda provider: (recorded or {}).get(provider, []),
        settings=Settings(tmp_path / "run" / "s.sock", tmp_path / "run", tmp_path / "state",
                          tmp_path / "config"))


def test_the_daemon_offers_each_listed_provider_once_in_the_listed_preference(
        tmp_path: Path) -> None:
    registry = build_providers(context(tmp_path))
    assert registry.names() == sorted(cls.name for cls in OFFERED) == [
        "aws", "kubernetes", "local", "ssh"]
    assert sorted(registry.names(), key=registry.preference) == [
        "local", "ssh", "aws", "kubernetes"]
    assert registry.preference("nowhere") > registry.preference("aws")
    assert "loadtest" not in registry.names()
    assert "loadtest" in build_providers(context(tmp_path), ["loadtest"]).names()


def test_a_planned_provider_and_an_unknown_one_are_refused_as_such(tmp_path: Path) -> None:
    registry = ProviderRegistry([LocalProvider.build(context(tmp_path))], planned=["gcp"])
    with pytest.raises(ProtocolError) as planned:
        registry.get("gcp")
    assert (planned.value.code, planned.value.message, planned.value.hint) == (
        ErrorCode.UNSUPPORTED,
        "the gcp provider is not available in this version of clusterd",
        "available: local")
    with pytest.raises(ProtocolError) as unknown:
        build_providers(context(tmp_path)).get("gcp")
    assert (unknown.value.code, unknown.value.message) == (
        ErrorCode.INVALID_ARGUMENT, "unknown infra 'gcp'")


def test_the_ssh_provider_counts_the_hosts_its_recorded_clusters_hold(tmp_path: Path) -> None:
    host = SSHHost(SSHTarget("10.0.0.5", 22, "alice"), 4.0, 15.6)
    built = build_providers(context(tmp_path, {"ssh": [("dev", SSHHandle("p", (host,)))]}))
    ssh = built.get("ssh")
    assert isinstance(ssh, SSHProvider)
    assert ssh._taken() == {SSHTarget("10.0.0.5", 22, "alice"): "dev"}


def test_each_provider_honours_only_fields_that_depend_on_the_provider() -> None:
    some = {f.path for f in fields.FIELDS if f.support == fields.Support.SOME}
    for cls in (*OFFERED, *TEST_ONLY):
        assert cls.honoured_fields <= some, cls.name
    assert {cls.name: cls.skypilot_cloud for cls in OFFERED} == {
        "local": "Local", "ssh": "SSH", "aws": "AWS", "kubernetes": "Kubernetes"}


class TinyCatalog:
    def accelerator_rows(self, name: str | None = None) -> list[dict[str, object]]:
        rows: list[dict[str, object]] = [{"accelerator": "X1", "count": 2}]
        return [r for r in rows if name in (None, r["accelerator"])]

    def accelerator_names(self) -> list[str]:
        return ["X1"]


class NewProvider(ProviderDefaults):
    """A provider the daemon has never heard of: everything it needs is said here."""

    name: ClassVar[str] = "new"
    skypilot_cloud: ClassVar[str] = "New"
    can_stop: ClassVar[bool] = True
    honoured_fields: ClassVar[frozenset[str]] = frozenset({"resources.labels"})
    check_top_level: ClassVar[tuple[str, ...]] = ("widgets",)

    async def accelerators(self) -> TinyCatalog:
        return TinyCatalog()

    async def check(self) -> dict[str, Any]:
        return {"ok": True, "detail": "fine", "widgets": ["w1"]}


def handlers_with(registry: ProviderRegistry) -> Handlers:
    # Only the provider-facing ops are called here: the services are never reached.
    return Handlers(None, None, None, None, None, registry, None, None, None,  # type: ignore[arg-type]
                    managed=None, managed_store=None, storage=None, cost=None)  # type: ignore[arg-type]


@pytest.mark.anyio
async def test_a_new_provider_is_asked_what_the_daemon_used_to_know_of_each(
        tmp_path: Path) -> None:
    registry = ProviderRegistry([LocalProvider(tmp_path), NewProvider()])
    handlers = handlers_with(registry)
    checked = await handlers.check(None, protocol.CheckArgs())  # type: ignore[arg-type]
    assert checked["widgets"] == ["w1"] and "widgets" not in checked["providers"]["new"]
    assert checked["providers"]["new"] == {"ok": True, "detail": "fine"}
    assert set(checked["providers"]) == {"local", "new"}
    gpus = await handlers.show_gpus(None, protocol.ShowGpusArgs())  # type: ignore[arg-type]
    assert gpus == {"accelerators": [{"accelerator": "X1", "count": 2, "provider": "new"}]}
    with pytest.raises(ProtocolError) as unknown:
        await handlers.show_gpus(None, protocol.ShowGpusArgs(name="Z9"))  # type: ignore[arg-type]
    assert unknown.value.hint == "known: X1"
    labels = Resources(labels=(("team", "a"),))
    assert fields.on_provider(labels, "new", registry.honoured_fields("new")) == ([], [])
    warned, _ = fields.on_provider(labels, "local", registry.honoured_fields("local"))
    assert warned and warned[0].startswith("resources.labels: has no effect on local")
