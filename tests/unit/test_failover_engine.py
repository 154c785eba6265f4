"""The failover engine on its own: order, blocking by scope, the progress line, the table."""

from __future__ import annotations

import time
from collections.abc import Callable

from clusterd.providers.base import BlockScope, ClusterRequest, Placement, ProvisionError
from clusterd.provision.failover import (
    Failover,
    Option,
    Steering,
    format_table,
    order_options,
)
from clusterd.tasks.spec import Resources

REQUEST = ClusterRequest("c", "c-1", 1, Resources())
# Where prices tie: as the daemon's providers are listed (providers/offered.py).
PREFERENCE = ["local", "ssh", "aws"].index


def option(provider: str, region: str | None, zone: str | None, price: float,
           rank: int = 0, instance_type: str | None = "p4d.24xlarge") -> Option:
    return Option(Placement(provider, region, zone, instance_type, 96, 1152, "A100", 8, price),
                  REQUEST, rank)


def aws_options() -> list[Option]:
    return [option("aws", "us-east-1", z, 32.77) for z in ("us-east-1a", "us-east-1b",
                                                          "us-east-1c")] + [
        option("aws", "us-west-2", z, 32.77) for z in ("us-west-2a", "us-west-2b")] + [
        option("local", None, None, 0.0, instance_type=None)]


def walk(failover: Failover, failures: dict[str, BlockScope]) -> list[str]:
    """Try every option in order, failing those named in `failures` with their scope."""
    tried = []
    for candidate in failover:
        where = candidate.describe()
        tried.append(where)
        scope = next((s for k, s in failures.items() if where.startswith(k)), None)
        if scope is None:
            failover.succeeded(candidate, time.monotonic())
            break
        failover.failed(candidate, ProvisionError(f"{scope.name}: no", scope), time.monotonic())
    return tried


def providers_in_order(options: list[Option], ordered: bool,
                       preference: Callable[[str], int] = PREFERENCE) -> list[str]:
    return [o.placement.provider for o in order_options(options, ordered, preference)]


def test_order_is_cheapest_first_and_ordered_keeps_the_users_order() -> None:
    assert providers_in_order(aws_options(), ordered=False)[0] == "local"
    ranked = [option("aws", "us-east-1", "us-east-1a", 32.77, rank=0),
              option("local", None, None, 0.0, rank=1, instance_type=None)]
    assert providers_in_order(ranked, ordered=True) == ["aws", "local"]
    assert providers_in_order(ranked, ordered=False) == ["local", "aws"]


def test_where_prices_tie_the_providers_preference_decides() -> None:
    free = [option("ssh", "pool", None, 0.0, instance_type=None),
            option("local", None, None, 0.0, instance_type=None)]
    assert providers_in_order(free, ordered=False) == ["local", "ssh"]
    assert providers_in_order(free, ordered=False, preference=["ssh", "local"].index) == [
        "ssh", "local"]


def test_a_zone_failure_moves_to_the_next_zone() -> None:
    failover = Failover(aws_options())
    tried = walk(failover, {"aws/us-east-1/us-east-1a": BlockScope.ZONE,
                            "aws/us-east-1/us-east-1b": BlockScope.ZONE})
    assert tried[-1] == "aws/us-east-1/us-east-1c (p4d.24xlarge)" and len(tried) == 3


def test_a_region_failure_skips_the_whole_region() -> None:
    failover = Failover(aws_options())
    tried = walk(failover, {"aws/us-east-1": BlockScope.REGION})
    assert tried == ["aws/us-east-1/us-east-1a (p4d.24xlarge)",
                     "aws/us-west-2/us-west-2a (p4d.24xlarge)"]


def test_a_placement_failure_leaves_other_shapes_in_the_same_place() -> None:
    # Kubernetes: the GPU pod cannot be scheduled now; a CPU pod in the same context can.
    gpu = option("kubernetes", "bed-a", None, 0.0, rank=0, instance_type="1CPU--1A100")
    cpu = option("kubernetes", "bed-a", None, 0.0, rank=1, instance_type="1CPU")
    other = option("kubernetes", "bed-b", None, 0.0, rank=2, instance_type="1CPU--1A100")
    failover = Failover([gpu, cpu, other])
    tried = walk(failover, {"kubernetes/bed-a (1CPU--1A100)": BlockScope.PLACEMENT})
    assert tried == ["kubernetes/bed-a (1CPU--1A100)", "kubernetes/bed-a (1CPU)"]
    assert not failover.blocklist.blocks(other.placement)


def test_a_provider_failure_skips_the_provider() -> None:
    failover = Failover(aws_options())
    tried = walk(failover, {"aws": BlockScope.PROVIDER})
    assert tried == ["aws/us-east-1/us-east-1a (p4d.24xlarge)", "local"]


def test_the_progress_line_names_what_comes_next() -> None:
    failover = Failover(aws_options())
    it = iter(failover)
    first = next(it)
    line = failover.failed(first, ProvisionError(
        "InsufficientInstanceCapacity: We currently do not have sufficient capacity",
        BlockScope.ZONE), time.monotonic())
    assert line == ("aws/us-east-1/us-east-1a (p4d.24xlarge): InsufficientInstanceCapacity: "
                    "We currently do not have sufficient capacity — trying us-east-1b")
    second = next(it)
    line = failover.failed(second, ProvisionError("VcpuLimitExceeded: quota",
                                                  BlockScope.REGION), time.monotonic())
    assert line.endswith("— trying us-west-2/us-west-2a")
    third = next(it)
    line = failover.failed(third, ProvisionError("AuthFailure: no", BlockScope.PROVIDER),
                           time.monotonic())
    assert line.endswith("— trying local")
    last = next(it)
    line = failover.failed(last, ProvisionError("no", BlockScope.PROVIDER), time.monotonic())
    assert line.endswith("— no other place to try")


def test_the_table_has_a_row_per_attempt_and_a_new_round_unblocks() -> None:
    failover = Failover(aws_options())
    walk(failover, {"aws": BlockScope.ZONE, "local": BlockScope.PROVIDER})
    assert len(failover.history) == 6
    table = failover.table().splitlines()
    assert table[0].split() == ["INFRA", "RESOURCES", "REASON"]
    assert len(table) == 7 and "aws/us-west-2/us-west-2b" in table[5]
    assert list(failover) == []  # everything blocked
    failover.new_round(aws_options(), [])
    assert len(list(failover)) == 6 and failover.round == 2


def lost_in(zone: str) -> Placement:
    return next(o.placement for o in aws_options() if o.placement.zone == zone)


def test_a_relaunch_steered_to_its_region_skips_the_lost_zone_in_round_one_only() -> None:
    # FAILOVER: the region it was lost in first, but not the zone just preempted.
    lost = lost_in("us-west-2a")
    steering = Steering(("aws", "us-west-2"), ((lost, BlockScope.ZONE),))
    failover = Failover(aws_options(), steering=steering)
    assert [o.describe() for o in failover][:2] == ["aws/us-west-2/us-west-2b (p4d.24xlarge)",
                                                    "aws/us-east-1/us-east-1a (p4d.24xlarge)"]
    failover.new_round(aws_options(), [])
    # Capacity may come back where it was lost: later rounds try it, still region first.
    assert [o.describe() for o in failover][:2] == ["aws/us-west-2/us-west-2a (p4d.24xlarge)",
                                                    "aws/us-west-2/us-west-2b (p4d.24xlarge)"]
    assert steering.describe() == "aws/us-west-2 first, not aws/us-west-2/us-west-2a"


def test_a_relaunch_steered_away_from_its_region_tries_the_others_first() -> None:
    # EAGER_NEXT_REGION: every other region before any zone of the one it was lost in.
    steering = Steering(avoid=((lost_in("us-east-1b"), BlockScope.REGION),))
    failover = Failover(aws_options(), steering=steering)
    assert walk(failover, {"aws/us-west-2": BlockScope.ZONE}) == [
        "aws/us-west-2/us-west-2a (p4d.24xlarge)", "aws/us-west-2/us-west-2b (p4d.24xlarge)",
        "local"]
    assert steering.describe() == "not aws/us-east-1"


def test_format_table_keeps_one_line_per_attempt() -> None:
    from clusterd.provision.failover import Attempt

    text = format_table([Attempt("aws/us-east-1", "m6i.large", "first line\nsecond", "zone")])
    assert text.splitlines()[1].endswith("first line")


def test_places_are_labelled_by_the_parts_they_have() -> None:
    assert option("aws", "us-east-1", "us-east-1a", 1.0).placement.infra == (
        "aws/us-east-1/us-east-1a")
    assert option("ssh", "pool", None, 0.0, instance_type=None).describe() == "ssh/pool"
    assert option("local", None, None, 0.0).describe() == "local (p4d.24xlarge)"
