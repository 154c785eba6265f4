"""Cluster handles as typed data: each provider's handle is its own dataclass, registered by the
provider's name, and the record's `handle` column keeps the JSON it always had. Records written
by the clusterd before handles had types (one per provider, and older forms) load, and are
written back as they were."""

from __future__ import annotations

import dataclasses
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.providers.aws.handle import AWSHandle, AWSNode
from clusterd.providers.base import Placement, ProviderHandle, RawHandle
from clusterd.providers.loadtest import LoadTestHandle, LoadTestProvider
from clusterd.providers.local import LocalHandle
from clusterd.providers.ssh import SSHHandle, SSHHost, SSHProvider
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_client import AgentConnections
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.tunnels import TunnelManager, TunnelState
from clusterd.state import ClusterStore, Database
from clusterd.state.db import dumps
from clusterd.state.handles import ClusterHandle, RuntimeHandle
from clusterd.state.resources import placement_json

pytestmark = pytest.mark.anyio

# `handle` columns as the clusterd before typed handles wrote them (its dumps: sorted keys, no
# spaces), one per provider, each with what that provider's clusters hold when UP (or, aws,
# while a launch waits for its nodes; the text is from a real EC2 test bed run).
LOCAL_UP = (
    '{"provider":{"dir":"/home/u/.local/state/clusterd/local/dev-0f4e74"},'
    '"runtime":{"agent_endpoint":"unix:/run/user/1000/clusterd/agents/dev-0f4e74.sock",'
    '"agent_listen":"unix:/run/user/1000/clusterd/agents/dev-0f4e74.sock",'
    '"agent_token":"5e1f","ports":{"gcs_port":45535,"node_manager_port":36143,'
    '"object_manager_port":36145,"ray_client_server_port":45605},'
    '"ray_address":"127.0.0.1:45535","worker_ports":{}},"tunnel":null}')
SSH_UP = (
    '{"provider":{"hosts":[{"cpus":2.0,"host":"127.0.0.2","host_key_alias":null,'
    '"identity_file":"/k/id","memory_gb":1.5,"port":2322,"proxy_command":null,'
    '"strict_host_keys":false,"user":"cdt1"},{"cpus":4.0,"host":"127.0.0.3",'
    '"host_key_alias":null,"identity_file":"/k/id","memory_gb":7.7,"port":2322,'
    '"proxy_command":null,"strict_host_keys":true,"user":"cdt1"}],"pool":"bed"},'
    '"runtime":{"agent_listen":"unix:~/.clusterd/s/9edbbba0aa.sock",'
    '"agent_socket":"/home/cdt1/.clusterd/s/9edbbba0aa.sock","agent_token":"f00d",'
    '"head_ssh":{"host":"127.0.0.2","host_key_alias":null,"identity_file":"/k/id",'
    '"port":2322,"proxy_command":null,"strict_host_keys":false,"user":"cdt1"},'
    '"ports":{"gcs_port":45535},"ray_address":"127.0.0.2:45535",'
    '"worker_ports":{"127.0.0.3:2322":{"node_manager_port":40001}}},'
    '"tunnel":{"alive":true,"head":"cdt1@127.0.0.2:2322","opened_at":1796127171.5,'
    '"remote":"/home/cdt1/.clusterd/s/9edbbba0aa.sock","reopened":1,'
    '"socket":"/run/user/1000/clusterd/tunnels/dev-0f4e74.sock"}}')
AWS_WAITING = (
    '{"intent":{"accelerator":null,"accelerator_count":0.0,"cpus":2.0,'
    '"instance_type":"c6i.large","memory_gb":4.0,"price_per_hour":0.0248,"provider":"aws",'
    '"region":"us-east-1","spot":true,"zone":"us-east-1f"},"provider":{"cpus":2.0,'
    '"gpus":0.0,"instance_type":"c6i.large","key_name":"clusterd-1f544e078d","nodes":[{"id":'
    '"i-2f4b72825924aa646","ip":"127.1.6.4","launched":"2026-12-01 12:33:23+00:00",'
    '"public_ip":null,"reason":"","role":"head","state":"running"}],"region":"us-east-1",'
    '"security_group":"sg-0187e0c0b356a6a6c","spot":true,"ssh_user":"ubuntu","subnet":'
    '"subnet-a5494628e714bab5a","use_internal_ips":true,"vpc":"vpc-56ae5bd1f1f3520e3",'
    '"zone":"us-east-1f"}}')
# As scripts/benchmarks.py inserts them (json.dumps' own spacing).
LOADTEST = json.dumps({"provider": {"nodes": 1}})
LOADTEST_STARTED = '{"provider":{"nodes":3,"stopped":false}}'
# A runtime recorded before agents had a token (its agent on a TCP port).
LOCAL_PRE_TOKEN = (
    '{"provider":{"dir":"/s/local/old-1"},"runtime":{"agent_port":12345,'
    '"ports":{"gcs_port":6379},"ray_address":"127.0.0.1:6379","worker_ports":{}}}')
# A record of a provider this clusterd does not have (written by another build).
NOT_OFFERED = '{"provider":{"project":"p-1","vms":["vm-0"],"zone":"us-central1-a"}}'


def insert_row(path: Path, name: str, provider: str, handle: str | None) -> None:
    """A record as an earlier clusterd left it, written with SQL, not through the store."""
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO clusters (name, provider, cloud_name, status, num_nodes,"
            " requested_resources, handle, config_hash, created_at, status_updated_at)"
            " VALUES (?, ?, ?, 'UP', 1, '{}', ?, 'h', 1.0, 1.0)",
            [name, provider, f"{name}-0f4e74", handle])


def column(path: Path, name: str) -> str | None:
    with sqlite3.connect(path) as conn:
        row = conn.execute("SELECT handle FROM clusters WHERE name = ?", [name]).fetchone()
    return None if row is None else row[0]


async def loaded(db: Database, name: str, provider: str, handle: str | None) -> ClusterHandle:
    insert_row(db.path, name, provider, handle)
    store = ClusterStore(db)
    await store.load()
    record = store.get(name)
    assert record is not None
    return record.handle


def without_nulls(text: str) -> dict[str, Any]:
    return {k: v for k, v in json.loads(text).items() if v is not None}


async def test_a_local_record_of_the_untyped_format_loads_as_typed(db: Database) -> None:
    handle = await loaded(db, "dev", "local", LOCAL_UP)
    assert handle.provider == LocalHandle("/home/u/.local/state/clusterd/local/dev-0f4e74")
    assert handle.runtime is not None and handle.runtime.head_ssh is None
    assert handle.runtime.agent_endpoint == "unix:/run/user/1000/clusterd/agents/dev-0f4e74.sock"
    assert handle.runtime.agent_token == "5e1f" and handle.runtime.ports["gcs_port"] == 45535
    assert handle.tunnel is None and handle.intent is None
    # Written back with the same keys and values ("tunnel": null is left out: read alike).
    written = handle.to_json()
    assert written == without_nulls(LOCAL_UP)
    assert dumps(written) == LOCAL_UP.replace(',"tunnel":null', "")


async def test_an_ssh_record_of_the_untyped_format_loads_as_typed(db: Database) -> None:
    handle = await loaded(db, "dev", "ssh", SSH_UP)
    assert isinstance(handle.provider, SSHHandle) and handle.provider.pool == "bed"
    assert handle.provider.held_hosts() == (SSHTarget("127.0.0.2", 2322, "cdt1", "/k/id"),
                                            SSHTarget("127.0.0.3", 2322, "cdt1", "/k/id"))
    assert handle.provider.hosts[1].target.strict_host_keys
    assert (handle.provider.hosts[1].cpus, handle.provider.hosts[1].memory_gb) == (4.0, 7.7)
    assert handle.runtime is not None
    assert handle.runtime.head_ssh == SSHTarget("127.0.0.2", 2322, "cdt1", "/k/id")
    assert handle.runtime.worker_ports == {"127.0.0.3:2322": {"node_manager_port": 40001}}
    assert handle.tunnel == TunnelState("/run/user/1000/clusterd/tunnels/dev-0f4e74.sock",
                                        "cdt1@127.0.0.2:2322",
                                        "/home/cdt1/.clusterd/s/9edbbba0aa.sock", True,
                                        1796127171.5, 1)
    assert dumps(handle.to_json()) == SSH_UP


async def test_an_aws_record_of_the_untyped_format_loads_as_typed(db: Database) -> None:
    handle = await loaded(db, "sp", "aws", AWS_WAITING)
    assert handle.intent == Placement("aws", "us-east-1", "us-east-1f", "c6i.large", 2.0, 4.0,
                                      None, 0.0, 0.0248, True)
    provider = handle.provider
    assert isinstance(provider, AWSHandle)
    assert (provider.region, provider.zone, provider.spot, provider.security_group) == (
        "us-east-1", "us-east-1f", True, "sg-0187e0c0b356a6a6c")
    assert provider.nodes == (AWSNode("i-2f4b72825924aa646", "head", "127.1.6.4", None,
                                      "running", "", "2026-12-01 12:33:23+00:00"),)
    assert provider.instance_ids == ["i-2f4b72825924aa646"]
    assert handle.runtime is None
    assert dumps(handle.to_json()) == AWS_WAITING


async def test_loadtest_records_load_as_typed(db: Database) -> None:
    assert (await loaded(db, "load-0", "loadtest", LOADTEST)).provider == LoadTestHandle(1)
    started = await loaded(db, "load-1", "loadtest", LOADTEST_STARTED)
    assert started.provider == LoadTestHandle(3, stopped=False)
    assert dumps(started.to_json()) == LOADTEST_STARTED
    assert json.loads(dumps(LoadTestHandle(1).to_json())) == {"nodes": 1}


async def test_a_runtime_from_before_agent_tokens_loads_and_is_refused_as_before(
        db: Database, tmp_path: Path) -> None:
    handle = await loaded(db, "old", "local", LOCAL_PRE_TOKEN)
    assert handle.runtime is not None and handle.runtime.agent_token is None
    access = AgentAccess(AgentConnections(), TunnelManager(
        SSHConnections(HostKeyStore(tmp_path / "known_hosts")), tmp_path / "tunnels"))
    with pytest.raises(ProtocolError) as refused:
        await access.endpoint("old", "old-0f4e74", handle.runtime)
    assert refused.value.code == ErrorCode.AGENT_VERSION_MISMATCH
    with pytest.raises(ProtocolError) as none:
        await access.endpoint("new", "new-0f4e74", None)
    assert (none.value.code, none.value.message) == (
        ErrorCode.AGENT_UNREACHABLE, "cluster new has no agent recorded")


async def test_a_handle_of_a_provider_not_offered_here_is_kept_as_it_was(
        db: Database) -> None:
    handle = await loaded(db, "k", "gcp", NOT_OFFERED)
    assert handle.provider == RawHandle(json.loads(NOT_OFFERED)["provider"])
    store = ClusterStore(db)
    await store.load()
    await store.update("k", autostop_minutes=5.0)
    record = store.get("k")
    assert record is not None
    await store.update("k", handle=dataclasses.replace(record.handle))  # rewritten whole
    assert column(db.path, "k") == NOT_OFFERED


async def test_an_empty_handle_is_a_null_column(db: Database) -> None:
    assert (await loaded(db, "fresh", "local", None)) == ClusterHandle()
    assert ClusterHandle().to_json() is None


@dataclasses.dataclass(frozen=True)
class NewHandle(ProviderHandle, provider="new-in-test"):
    """A provider's handle the daemon has never seen: declaring it registers it."""

    pods: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"pods": list(self.pods)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> NewHandle:
        return cls(tuple(data["pods"]))


async def test_a_new_providers_handle_registers_itself_and_round_trips(
        db: Database) -> None:
    store = ClusterStore(db)
    await store.load()
    insert_row(db.path, "n", "new-in-test", None)
    await store.load()
    handle = ClusterHandle(intent=Placement("new-in-test", "ctx", None, None, 1, 2),
                           provider=NewHandle(("pod-0", "pod-1")))
    await store.update("n", handle=handle)
    assert json.loads(column(db.path, "n") or "")["provider"] == {"pods": ["pod-0", "pod-1"]}
    again = ClusterStore(db)
    await again.load()
    record = again.get("n")
    assert record is not None and record.handle == handle
    with pytest.raises(TypeError, match="the new-in-test provider's handle already"):
        type("Other", (ProviderHandle,), {}, provider="new-in-test")


@pytest.mark.parametrize("handle", [
    LocalHandle("/s/local/a-1"),
    SSHHandle("p", (SSHHost(SSHTarget("h", 22, "u", "/k", None, None, True), 2.0, 3.5),)),
    AWSHandle("us-east-1", "us-east-1a", "m6i.large", False, "vpc-1", "subnet-1", "sg-1",
              "clusterd-k", "ubuntu", False, 2.0, 1.0,
              (AWSNode("i-1", "head", "10.0.0.1", "3.3.3.3", "running", "", "t0"),
               AWSNode("i-2", "worker", "10.0.0.2", None, "stopped", "User initiated", "t1"))),
    LoadTestHandle(2, stopped=False),
    RawHandle({"anything": [1, 2]}),
], ids=lambda h: type(h).__name__)
def test_each_handle_survives_its_json(handle: ProviderHandle) -> None:
    assert type(handle).from_json(json.loads(dumps(handle.to_json()))) == handle


def test_a_runtime_handle_writes_the_keys_the_runtime_always_wrote() -> None:
    local = RuntimeHandle({"gcs_port": 1}, {}, "127.0.0.1:1", "unix:/a", "t",
                          agent_endpoint="unix:/a")
    assert set(local.to_json()) == {"ports", "worker_ports", "ray_address", "agent_listen",
                                    "agent_token", "agent_endpoint"}
    remote = RuntimeHandle({"gcs_port": 1}, {"n": {"node_manager_port": 2}}, "10.0.0.1:1",
                           "unix:~/s", "t", head_ssh=SSHTarget("10.0.0.1", 22, "u"),
                           agent_socket="/home/u/s")
    assert set(remote.to_json()) == {"ports", "worker_ports", "ray_address", "agent_listen",
                                     "agent_token", "head_ssh", "agent_socket"}
    assert RuntimeHandle.from_json(json.loads(dumps(remote.to_json()))) == remote


@pytest.mark.parametrize("intent", [
    Placement("aws", "us-east-1", "us-east-1f", "c6i.large", 2.0, 4.0, None, 0.0, 0.02, True),
    Placement("ssh", "pool", None, None, 0, 0),
    Placement("loadtest", "mem", None, "m.test", 4, 16),
], ids=lambda p: p.provider)
def test_the_handle_for_an_intent_is_what_the_intent_read_as_a_handle_was(
        intent: Placement, tmp_path: Path) -> None:
    """Before handles had types, where a create call never answered the provider was handed
    the intent itself as its handle: the typed stand-in reads the same."""
    providers = {
        "aws": AWSHandle.for_intent,
        "ssh": lambda p: SSHProvider(tmp_path / "pools.yaml", None, dict  # type: ignore[arg-type]
                                     ).handle_for_intent("c-1", p),
        "loadtest": lambda p: LoadTestProvider().handle_for_intent("c-1", p),
    }
    decoded = ProviderHandle.decode(intent.provider, placement_json(intent))
    assert providers[intent.provider](intent) == decoded
