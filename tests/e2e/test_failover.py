"""Launch with failover, on the EC2 test bed with faults injected for real: the bed's endpoint
answers EC2 error documents for the calls its rules match (capacity, quotas, credentials),
and the daemon's botocore sees exactly what it would see from EC2."""

from __future__ import annotations

import json
import subprocess
import time
from collections.abc import Iterator

import pytest

from tests.e2e.ec2bed import EC2Bed, cloud_name, running
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray]


@pytest.fixture(scope="module")
def fo(ec2: EC2Bed) -> Iterator[Daemon]:
    with running(ec2.daemon("cdfo-", CLUSTERD_RETRY_GAP="2", CLUSTERD_RETRY_MAX_GAP="3")
                 ) as daemon:
        yield daemon


@pytest.fixture(autouse=True)
def no_faults(ec2: EC2Bed) -> Iterator[None]:
    ec2.clear_faults()
    yield
    ec2.clear_faults()


def task(ec2: EC2Bed, extra: str = "", cpus: int = 2) -> str:
    """A small task; on the bed's runtime image where there is one (no install to wait for:
    these tests are about where clusters land)."""
    images = ec2.runtime_images()
    image = ("  image_id:\n" + "".join(f"    {region}: {ami}\n"
                                       for region, ami in images.items())) if images else ""
    return f"resources:\n  cpus: {cpus}\n{image}{extra}run: echo landed\n"


def launch(daemon: Daemon, name: str, text: str, *args: str,
           timeout: float = 900) -> subprocess.CompletedProcess[str]:
    (daemon.root / f"{name}.yaml").write_text(text)
    return daemon.ctl("launch", "-c", name, f"{name}.yaml", *args, timeout=timeout)


def attempts(stderr: str) -> list[str]:
    return [line.split("] ", 1)[1] for line in stderr.splitlines() if " — " in line]


def down(daemon: Daemon, ec2: EC2Bed, name: str) -> None:
    cloud = cloud_name(daemon, name)
    result = daemon.ctl("down", "-y", name, timeout=600)
    assert result.returncode == 0, result.stderr
    assert ec2.leftovers(cloud) == []


def test_a_stockout_in_two_zones_lands_in_the_third(ec2: EC2Bed, fo: Daemon) -> None:
    for zone in ("us-east-1a", "us-east-1b"):
        ec2.fault("--code", "InsufficientInstanceCapacity", "--zone", zone)
    result = launch(fo, "so", task(ec2), "--infra", "aws/us-east-1")
    assert result.returncode == 0, result.stderr + fo.log()[-3000:]
    tried = attempts(result.stderr)
    assert tried[0].startswith("aws/us-east-1/us-east-1a (c6i.large): "
                               "InsufficientInstanceCapacity: We currently do not have")
    assert tried[0].endswith("— trying us-east-1b")
    assert tried[1].startswith("aws/us-east-1/us-east-1b") and tried[1].endswith(
        "— trying us-east-1c")
    assert len(tried) == 2
    assert fo.cluster("so")["infra"] == "aws/us-east-1/us-east-1c"  # type: ignore[index]
    events = json.loads(fo.ctl("events", "so", "--json").stdout)
    assert sum(e["kind"] == "provision" for e in events) == 2
    down(fo, ec2, "so")


def test_a_quota_error_skips_the_whole_region(ec2: EC2Bed, fo: Daemon) -> None:
    ec2.fault("--code", "VcpuLimitExceeded", "--region", "us-east-1", "--action",
              "RunInstances")
    result = launch(fo, "quota", task(ec2), "--infra", "aws")
    assert result.returncode == 0, result.stderr + fo.log()[-3000:]
    tried = attempts(result.stderr)
    assert [t.split(" ")[0] for t in tried] == ["aws/us-east-1/us-east-1a"]
    assert "VcpuLimitExceeded" in tried[0] and tried[0].endswith("— trying us-west-2/us-west-2a")
    assert fo.cluster("quota")["infra"].startswith("aws/us-west-2/")  # type: ignore[index]
    down(fo, ec2, "quota")


def test_bad_credentials_on_aws_fall_over_to_local(ec2: EC2Bed, fo: Daemon) -> None:
    ec2.fault("--code", "UnauthorizedOperation", "--action", "RunInstances")
    images = "".join(f"        {region}: {ami}\n" for region, ami in
                     ec2.runtime_images().items())
    aws = "    - infra: aws\n" + (f"      image_id:\n{images}" if images else "")
    alternatives = ("resources:\n  cpus: 2\n  ordered:\n" + aws
                    + "    - infra: local\n      cpus: 1\nrun: echo landed\n")
    result = launch(fo, "cred", alternatives)
    assert result.returncode == 0, result.stderr + fo.log()[-3000:]
    tried = attempts(result.stderr)
    assert len(tried) == 1 and "UnauthorizedOperation" in tried[0]
    assert tried[0].endswith("— trying local")
    assert fo.cluster("cred")["infra"] == "local"  # type: ignore[index]
    assert "landed" in result.stdout
    down(fo, ec2, "cred")
    # Cheapest first (any_of): this machine costs nothing, so aws is not even tried.
    cheapest = alternatives.replace("ordered:", "any_of:")
    result = launch(fo, "cheap", cheapest)
    assert result.returncode == 0 and attempts(result.stderr) == []
    assert fo.cluster("cheap")["infra"] == "local"  # type: ignore[index]
    down(fo, ec2, "cheap")


def test_every_zone_out_ends_with_a_table_of_every_attempt(ec2: EC2Bed, fo: Daemon) -> None:
    ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances")
    result = launch(fo, "none", task(ec2), "--infra", "aws/us-east-1")
    assert result.returncode == 1
    assert "no place could run none (5 attempts): [RESOURCES_UNAVAILABLE]" in result.stderr
    table = [line for line in result.stderr.splitlines()
             if line.startswith("aws/us-east-1/") and "  " in line]
    zones = [line.split()[0] for line in table]
    assert zones == [f"aws/us-east-1/us-east-1{z}" for z in "abcdf"], result.stderr
    assert all("InsufficientInstanceCapacity" in line for line in table)
    assert "INFRA" in result.stderr and "RESOURCES" in result.stderr
    assert fo.cluster("none") is None  # a launch that never got UP leaves no record
    leftovers = [i for i in ec2.aws()["instances"] if i["state"] != "terminated"
                 and i["tags"].get("clusterd-cluster") == "none"]
    assert leftovers == []


def _wait_for_round(daemon: Daemon, name: str) -> None:
    def round_failed() -> bool:
        events = json.loads(daemon.ctl("events", name, "--json").stdout or "[]")
        return any("found no capacity" in e["reason"] for e in events)

    wait_for(round_failed, 180, "a round of the launch to fail", interval=0.5)


def test_retry_until_up_lands_once_capacity_comes_back(ec2: EC2Bed, fo: Daemon) -> None:
    rule = ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances")
    (fo.root / "retry.yaml").write_text(task(ec2))
    process = fo.popen_ctl("launch", "-c", "retry", "--infra", "aws/us-east-1",
                           "--retry-until-up", "retry.yaml")
    try:
        _wait_for_round(fo, "retry")
        assert ec2.testbed("fault", "remove", rule).returncode == 0
        stdout, stderr = process.communicate(timeout=600)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, stderr
    assert "found no capacity" in stderr and "landed" in stdout
    down(fo, ec2, "retry")


def test_down_calls_off_a_launch_waiting_to_retry(ec2: EC2Bed, fo: Daemon) -> None:
    ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "RunInstances")
    (fo.root / "giveup.yaml").write_text(task(ec2))
    process = fo.popen_ctl("launch", "-c", "giveup", "--infra", "aws/us-east-1",
                           "--retry-until-up", "giveup.yaml")
    try:
        _wait_for_round(fo, "giveup")
        cloud = cloud_name(fo, "giveup")
        result = fo.ctl("down", "-y", "giveup", timeout=300)
        assert result.returncode == 0, result.stderr
        _, stderr = process.communicate(timeout=120)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1 and "[PREEMPTED]" in stderr
    assert fo.cluster("giveup") is None and ec2.leftovers(cloud) == []


def test_a_cluster_that_was_up_comes_back_only_where_it_lives(ec2: EC2Bed, fo: Daemon) -> None:
    result = launch(fo, "home", task(ec2), "--infra", "aws/us-east-1/us-east-1b")
    assert result.returncode == 0, result.stderr + fo.log()[-3000:]
    cloud = cloud_name(fo, "home")
    assert fo.ctl("stop", "-y", "home").returncode == 0
    ec2.fault("--code", "InsufficientInstanceCapacity", "--action", "StartInstances")
    started = time.monotonic()
    refused = fo.ctl("start", "home", timeout=300)
    assert refused.returncode == 1
    assert "home cannot come back where it lives (aws/us-east-1/us-east-1b" in refused.stderr
    assert "InsufficientInstanceCapacity" in refused.stderr
    assert time.monotonic() - started < 120
    instances = ec2.instances(cloud)
    assert len(instances) == 1 and instances[0]["zone"] == "us-east-1b"
    ec2.clear_faults()
    again = fo.ctl("start", "home", timeout=600)
    assert again.returncode == 0, again.stderr
    (instance,) = ec2.instances(cloud)
    assert instance["zone"] == "us-east-1b" and instance["state"] == "running"
    assert fo.ctl("exec", "home", "--", "echo back").stdout.strip() == "back"
    down(fo, ec2, "home")


def test_a_call_that_never_answers_is_a_failed_attempt_and_leaves_nothing(
        ec2: EC2Bed) -> None:
    # A daemon whose EC2 calls give up after 2 s (and botocore's retries): a hanging
    # RunInstances takes effect (instances appear in moto) but never answers.
    config = ec2.dir / "short-timeouts.yaml"
    config.write_text("aws:\n  vpc_name: clusterd-testbed\n  use_internal_ips: true\n"
                      "  request_timeout: 2\n")
    with running(ec2.daemon("cdhang-", CLUSTERD_CONFIG=str(config))) as daemon:
        ec2.fault("--code", "InternalError", "--hang", "--action", "RunInstances",
                  "--zone", "us-east-1a")
        result = launch(daemon, "hang", task(ec2), "--infra", "aws/us-east-1")
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        tried = attempts(result.stderr)
        assert len(tried) == 1 and tried[0].startswith("aws/us-east-1/us-east-1a")
        assert "did not answer in time" in tried[0] and tried[0].endswith("trying us-east-1b")
        cloud = cloud_name(daemon, "hang")
        instances = ec2.instances(cloud)
        made_in_a = [i for i in instances if i["zone"] == "us-east-1a"]
        assert made_in_a, "the hanging calls should have taken effect"
        assert {i["state"] for i in made_in_a} == {"terminated"}
        assert [i["zone"] for i in instances if i["state"] == "running"] == ["us-east-1b"]
        down(daemon, ec2, "hang")
