"""`launch --dryrun` / `exec --dryrun` as the services plan them: on the scripted provider
(the step for an existing cluster, failover order and prices, nothing made), and on AWS with
its catalog (the AWS-only flags choose the instance type and price; no EC2 call is made but
the zone names a placement needs)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.providers.aws import AWSProvider
from clusterd.providers.aws.catalog import load_catalog
from clusterd.providers.aws.ec2 import EC2Api
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.plan import LaunchRequest
from clusterd.services.dry_run import DryRun
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.keys import DaemonKey
from clusterd.state.db import Database
from clusterd.tasks.file_sync import CopyGuard
from clusterd.tasks.loader import load_task
from clusterd.tasks.overrides import apply_overrides
from clusterd.tasks.spec import Autostop, TaskSpec
from clusterd.user_config import UserConfig
from tests.scripted_provider import Services, build_services

pytestmark = pytest.mark.anyio


@pytest.fixture
async def bed(db: Database, tmp_path: Path) -> Services:
    return await build_services(db, tmp_path)


def task(text: str = "run: echo hi\n", cwd: str = "/", **overrides: Any) -> TaskSpec:
    loaded = load_task(yaml_text=text, source="t.yaml", cwd=cwd)
    return apply_overrides(loaded, cwd=cwd, **overrides)


async def test_a_new_cluster_is_planned_cheapest_first_and_nothing_is_made(
        bed: Services, tmp_path: Path) -> None:
    workdir = tmp_path / "wd"
    (workdir / "sub").mkdir(parents=True)
    (workdir / "a.txt").write_text("12345")
    (workdir / "sub" / "b.txt").write_text("678")
    (workdir / ".skyignore").write_text("ignored.bin\n")
    (workdir / "ignored.bin").write_bytes(b"x" * 1000)
    plan = await bed.clusters.dry_run.launch(LaunchRequest(
        "c", task("num_nodes: 2\nsetup: echo s\nrun: echo r\n", str(tmp_path),
                  workdir="wd", resources={"ports": ["8080"]}),
        autostop=Autostop(10)))
    assert (plan["step"], plan["exists"], plan["cluster"]) == ("new", False, "c")
    assert plan["placement"]["infra"] == "scripted/r1/r1-a"
    assert plan["placement"]["price_per_hour"] == 1.0
    assert plan["placement"]["cluster_price_per_hour"] == 2.0
    assert [p["zone"] for p in plan["alternatives"]] == ["r1-b", "r2-a"]
    assert plan["task"]["setup"] and plan["task"]["ports"] == ["8080"]
    # What the copy itself would send: its filters read as it reads them.
    (sync,) = plan["sync"]
    assert (sync["field"], sync["files"]) == ("workdir", 3)  # a.txt, sub/b.txt, .skyignore
    assert sync["bytes"] == 5 + 3 + len("ignored.bin\n")
    assert plan["autostop"] == {"idle_minutes": 10, "down": False, "wait_for": "jobs_and_ssh"}
    assert bed.store.get("c") is None and bed.provider.calls == []


async def test_no_room_anywhere_fails_as_the_launch_would(bed: Services) -> None:
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.dry_run.launch(
            LaunchRequest("c", task("resources:\n  infra: scripted/r9\nrun: x\n")))
    assert caught.value.code == ErrorCode.RESOURCES_UNAVAILABLE
    assert bed.store.get("c") is None


async def test_an_existing_cluster_says_what_would_happen_to_it(bed: Services) -> None:
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    calls = list(bed.provider.calls)
    plan = await bed.clusters.dry_run.launch(LaunchRequest("c", task()))
    assert (plan["step"], plan["status"], plan["exists"]) == ("reuse", "UP", True)
    assert "is UP on scripted/r1/r1-a (s.node): reused" in plan["says"]
    await bed.store.set_status("c", ClusterStatus.STOPPED, "stopped by the test")
    plan = await bed.clusters.dry_run.launch(LaunchRequest("c", task()))
    assert plan["step"] == "start" and "started where it lives" in plan["says"]
    with pytest.raises(ProtocolError) as caught:  # more than its nodes have
        await bed.clusters.dry_run.launch(LaunchRequest("c", task(num_nodes=3)))
    assert caught.value.code == ErrorCode.CLUSTER_MISMATCH
    assert bed.provider.calls == calls  # nothing asked of the provider, nothing made


async def test_exec_plans_a_job_on_an_up_cluster_without_setup(bed: Services) -> None:
    await bed.clusters.launch(bed.request(), LaunchRequest("c", TaskSpec()))
    plan = await bed.clusters.dry_run.exec("c", task("setup: echo s\nrun: echo r\n"),
                                           strict=False)
    assert plan["step"] == "run" and plan["task"] == {
        "name": None, "num_nodes": 1, "setup": False, "run": True, "ports": [], "envs": [],
        "secrets": []}
    await bed.store.set_status("c", ClusterStatus.STOPPED, "stopped by the test")
    with pytest.raises(ProtocolError) as caught:
        await bed.clusters.dry_run.exec("c", task(), strict=False)
    assert caught.value.code == ErrorCode.CLUSTER_NOT_UP


class CatalogZones(EC2Api):
    """The one EC2 answer a plan needs, the region's zone names (made up from the catalog's
    zone ids, as an account's are its own); any other call would be a dry run acting."""

    def __init__(self) -> None:
        super().__init__(lambda: 10.0)
        self.asked: list[str] = []

    async def zone_names(self, region: str) -> dict[str, str]:
        self.asked.append(region)
        ids = sorted({o.zone_id for offers in load_catalog().offers.values() for o in offers
                      if o.region == region})
        return {zone_id: f"{region}{chr(ord('a') + i)}" for i, zone_id in enumerate(ids)}

    async def call(self, *args: Any, **kwargs: Any) -> Any:
        raise AssertionError(f"a dry run made an EC2 call: {args}")


@pytest.fixture
async def aws(bed: Services, tmp_path: Path) -> tuple[DryRun, CatalogZones]:
    api = CatalogZones()
    provider = AWSProvider(lambda: UserConfig(tmp_path / "config"),
                           SSHConnections(HostKeyStore(tmp_path / "known_hosts")),
                           DaemonKey(tmp_path / "ssh"), "test", api=api)
    return DryRun(bed.store, ProviderRegistry([provider]), CopyGuard(()).check,
                  bed.clusters.ledger.prices), api


async def test_aws_flags_choose_from_the_catalog(aws: tuple[DryRun, CatalogZones]) -> None:
    dry_run, api = aws
    base = "resources:\n  infra: aws/us-east-1\n  instance_type: m6i.large\nrun: x\n"
    on_demand = await dry_run.launch(LaunchRequest("c", task(base)))
    assert on_demand["placement"]["instance_type"] == "m6i.large"
    spot = await dry_run.launch(LaunchRequest("c", task(base, resources={
        "instance_type": "p4d.24xlarge", "use_spot": True, "disk_size": 500,
        "image_id": "ami-0123"})))
    placed = spot["placement"]
    assert (placed["instance_type"], placed["accelerator"], placed["spot"]) == (
        "p4d.24xlarge", "A100", True)
    offers = [o for o in load_catalog().offers["p4d.24xlarge"] if o.region == "us-east-1"]
    assert placed["price_per_hour"] == min(o.spot_price for o in offers if o.spot_price)
    assert spot["requested"]["disk_size_gb"] == 500
    assert spot["requested"]["image_id"] == "ami-0123"
    assert spot["requested"]["use_spot"] is True
    gpus = await dry_run.launch(LaunchRequest("c", task(
        "resources:\n  infra: aws\nrun: x\n", resources={"gpus": "A100:8"}, num_nodes=2)))
    assert gpus["placement"]["instance_type"] == "p4d.24xlarge"
    assert gpus["placement"]["cluster_price_per_hour"] == pytest.approx(
        2 * gpus["placement"]["price_per_hour"])
    prices = [p["price_per_hour"] for p in [gpus["placement"], *gpus["alternatives"]]]
    assert prices == sorted(prices) and len(prices) > 1
    assert set(api.asked) >= {"us-east-1"}


async def test_an_aws_flag_that_cannot_apply_fails_as_the_launch_would(
        aws: tuple[DryRun, CatalogZones]) -> None:
    dry_run, _ = aws
    with pytest.raises(ProtocolError) as caught:
        await dry_run.launch(LaunchRequest("c", task(
            "resources:\n  infra: aws\nrun: x\n", resources={"gpus": "A100:3"})))
    assert caught.value.code == ErrorCode.RESOURCES_UNAVAILABLE
    assert "A100:3" in caught.value.message
