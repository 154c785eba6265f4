"""Every provider's placements carry their price per node and hour, from the same arithmetic
the cost ledger counts with (an ssh pool's price_per_hour, kubernetes.pricing on the pod's
requests): so resources.max_hourly_cost, the failover order and the launch's "$/h" see them,
not only AWS's catalog. The cap refuses a pool or a context above it, naming the cheapest."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import cast

import pytest

from clusterctl.protocol import ProtocolError
from clusterd.cost.prices import Prices
from clusterd.providers.base import ClusterRequest, Provider
from clusterd.providers.kubernetes import KubernetesProvider
from clusterd.providers.kubernetes.capacity import NodeCapacity
from clusterd.providers.registry import ProviderRegistry
from clusterd.providers.ssh import SSHProvider
from clusterd.providers.ssh_pools import load_pools
from clusterd.provision.candidates import Candidate, plan
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.keys import DaemonKey
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from clusterd.user_config import parse

pytestmark = pytest.mark.anyio

PRICING = """
kubernetes:
  allowed_contexts: [ctx-b, ctx-a]
  pricing: {cpu_per_hour: 0.05, memory_gib_per_hour: 0.01, gpu_per_hour: {T4: 0.4}}
"""
KUBECONFIG = """
apiVersion: v1
kind: Config
current-context: ctx-a
contexts:
- {name: ctx-a, context: {cluster: a, user: u, namespace: ns-a}}
- {name: ctx-b, context: {cluster: b, user: u, namespace: ns-b}}
clusters:
- {name: a, cluster: {server: "https://127.0.0.1:1"}}
- {name: b, cluster: {server: "https://127.0.0.1:2"}}
users:
- {name: u, user: {token: t}}
"""


class Unread(KubernetesProvider):
    """The provider, with no API server: no context's nodes can be read (the scheduler
    then decides), so every allowed context is a placement."""

    async def _capacities(self, context: str, namespace: str) -> list[NodeCapacity] | None:
        return None


@pytest.fixture
def kubernetes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> KubernetesProvider:
    (tmp_path / "kubeconfig").write_text(KUBECONFIG)
    monkeypatch.setenv("KUBECONFIG", str(tmp_path / "kubeconfig"))
    config = parse(tmp_path / "config.yaml", PRICING)
    return Unread(lambda: config, cast(SSHConnections, None), DaemonKey(tmp_path / "ssh"),
                  "clusterd-0123", tmp_path)


@pytest.fixture
def ssh(tmp_path: Path) -> SSHProvider:
    (tmp_path / "pools.yaml").write_text(
        "rack: {price_per_hour: 1.5, hosts: [10.0.0.1, 10.0.0.2]}\n")
    return SSHProvider(tmp_path / "pools.yaml", cast(SSHConnections, None), dict)


def request(resources: Resources, nodes: int = 1) -> ClusterRequest:
    return ClusterRequest("c", "c-1", nodes, resources)


async def test_a_pool_is_priced_at_its_price_per_hour_as_the_ledger_counts_it(
        ssh: SSHProvider, tmp_path: Path) -> None:
    (placed,) = await ssh.placements(request(Resources(infra=Infra("ssh", "rack"))))
    assert placed.price_per_hour == 1.5
    ledger = Prices(lambda: parse(tmp_path / "c.yaml", ""),
                    lambda: load_pools(tmp_path / "pools.yaml"))
    assert ledger.node(placed, ResourceRequest()).node_per_hour == placed.price_per_hour


async def test_a_pod_is_priced_on_its_requests_in_every_context_alike(
        kubernetes: KubernetesProvider, tmp_path: Path) -> None:
    asked = Resources(infra=Infra("kubernetes"), cpus=4, memory_gb=16, accelerator="T4",
                      accelerator_count=1)
    found = await kubernetes.placements(request(asked))
    # The contexts in the order allowed_contexts gives (their prices tie).
    assert [p.region for p in found] == ["ctx-b", "ctx-a"]
    assert [p.price_per_hour for p in found] == pytest.approx([4 * 0.05 + 16 * 0.01 + 0.4] * 2)
    ledger = Prices(lambda: parse(tmp_path / "c.yaml", PRICING), dict)
    assert ledger.node(found[0], ResourceRequest(asked)).node_per_hour == pytest.approx(
        found[0].price_per_hour)
    # The default pod (2 CPUs, 8 GB), with no GPU.
    (default, _) = await kubernetes.placements(request(Resources(infra=Infra("kubernetes"))))
    assert default.price_per_hour == pytest.approx(2 * 0.05 + 8 * 0.01)


def capped(provider: str, cap: float, region: str | None = None) -> Candidate:
    return Candidate(provider, Resources(infra=Infra(provider, region), max_hourly_cost=cap), 0)


async def test_the_cap_refuses_a_pool_above_it_naming_its_price(ssh: SSHProvider) -> None:
    registry = ProviderRegistry([cast(Provider, ssh)])
    with pytest.raises(ProtocolError) as refused:
        await plan([capped("ssh", 1.0, "rack")], registry, "c", "c-1", 1, False, False)
    assert ("every place costs more than $1 per node and hour; the cheapest is ssh/rack at "
            "$1.5 per node and hour") in refused.value.message
    options, _ = await plan([capped("ssh", 1.5, "rack")], registry, "c", "c-1", 1, False,
                            False)
    assert [o.placement.infra for o in options] == ["ssh/rack"]


async def test_the_cap_refuses_a_context_above_it_and_names_the_cheapest_of_all(
        ssh: SSHProvider, kubernetes: KubernetesProvider) -> None:
    registry = ProviderRegistry([cast(Provider, ssh), cast(Provider, kubernetes)])
    pod = 2 * 0.05 + 8 * 0.01  # $0.18 per pod and hour
    # Under $1: the pool ($1.5) is refused, the pods are not.
    options, refused = await plan([capped("ssh", 1.0, "rack"), capped("kubernetes", 1.0)],
                                  registry, "c", "c-1", 2, False, False)
    assert [o.placement.infra for o in options] == ["kubernetes/ctx-b", "kubernetes/ctx-a"]
    assert [a.infra for a in refused] == ["ssh/rack"] and "$1.5" in refused[0].reason
    # Under $0.1: nothing fits; the cheapest of all (a pod) is named.
    with pytest.raises(ProtocolError) as caught:
        await plan([capped("ssh", 0.1, "rack"), capped("kubernetes", 0.1)], registry, "c",
                   "c-1", 2, False, False)
    assert (f"the cheapest is kubernetes/ctx-b (2CPU--8GB) at ${pod:g} per node and hour"
            in caught.value.message)


async def test_failover_puts_the_cheaper_place_first_across_providers(
        ssh: SSHProvider, kubernetes: KubernetesProvider) -> None:
    registry = ProviderRegistry([cast(Provider, ssh), cast(Provider, kubernetes)])
    free = [dataclasses.replace(capped("ssh", 10, "rack"), resources=Resources(
        infra=Infra("ssh", "rack"))), capped("kubernetes", 10)]
    options, _ = await plan(free, registry, "c", "c-1", 1, False, False)
    # Pods at $0.18 before the pool at $1.5, though ssh is listed (and preferred) first.
    assert [o.placement.infra for o in options] == [
        "kubernetes/ctx-b", "kubernetes/ctx-a", "ssh/rack"]
