"""Candidates: the (provider, resources) pairs a task allows, and their placements.

A task naming a provider (`infra: aws`, `aws/us-east-1`, `ssh/POOL`, `local`) has candidates on
that provider only; one naming none may run on every provider that is configured here. Each of
SkyPilot's `any_of`/`ordered` alternatives is a candidate of its own.
"""

from __future__ import annotations

import dataclasses

import anyio

from clusterd.providers.base import BlockScope, ClusterRequest, Placement, ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.failover import Attempt, Option, order_options
from clusterd.tasks import fields
from clusterd.tasks.spec import Infra, Resources


@dataclasses.dataclass(frozen=True)
class Candidate:
    provider: str
    resources: Resources  # its infra names the provider
    rank: int  # position in the user's `ordered` list (0 otherwise)


async def candidates(options: tuple[Resources, ...], infra: Infra | None,
                     providers: ProviderRegistry) -> list[Candidate]:
    """`infra` (from --infra) overrides where each alternative goes."""
    enabled: list[str] | None = None
    found: list[Candidate] = []
    for rank, resources in enumerate(options):
        where = infra if infra is not None and infra.provider else resources.infra
        if where.provider:
            providers.get(where.provider)  # an unknown or planned provider is refused here
            names = [where.provider]
        else:
            if enabled is None:
                enabled = [p.name for p in providers.all() if await p.enabled()]
                enabled.sort(key=providers.preference)
            names = enabled
        for name in names:
            placed = dataclasses.replace(resources, infra=Infra(name, where.region, where.zone))
            found.append(Candidate(name, placed, rank))
    return list(dict.fromkeys(found))


def over_cap(cap: float, cheapest: Placement) -> str:
    """Why a candidate is refused for `max_hourly_cost`, naming the cheapest place that
    exists (where, what and at what price): what the user would have to accept instead."""
    return (f"resources.max_hourly_cost: every place costs more than ${cap:g} per node and "
            f"hour; the cheapest is {cheapest.describe()} at "
            f"${cheapest.price_per_hour:g} per node and hour")


async def plan(found: list[Candidate], providers: ProviderRegistry, name: str, cloud_name: str,
               num_nodes: int, autostop_down: bool, ordered: bool, strict: bool = False
               ) -> tuple[list[Option], list[Attempt]]:
    """Every candidate's placements, in the order to try them, and the candidates their
    provider refused outright (as attempts, for the final table). With a single candidate,
    its provider's refusal is raised as it is: it says best what is wrong. A task field that
    cannot apply on a candidate's provider refuses it there (with `strict`, so does a field
    that would merely have no effect there)."""
    options: list[Option] = []
    refusals: list[tuple[int, Attempt, ProvisionError]] = []
    # (cap, cheapest place) of each candidate refused because every place costs more.
    too_dear: list[tuple[float, Placement]] = []

    async def one(index: int, candidate: Candidate) -> None:
        request = ClusterRequest(name, cloud_name, num_nodes, candidate.resources,
                                 autostop_down=autostop_down)
        warnings, refused = fields.on_provider(candidate.resources, candidate.provider,
                                               providers.honoured_fields(candidate.provider),
                                               strict)
        try:
            if refused:
                raise ProvisionError("; ".join(refused), BlockScope.PROVIDER)
            placements = await providers.get(candidate.provider).placements(request)
        except ProvisionError as exc:
            infra = str(candidate.resources.infra)
            refusals.append((index, Attempt(infra, candidate.resources.display(num_nodes),
                                            exc.message, str(exc.scope)), exc))
            return
        cap = candidate.resources.max_hourly_cost
        affordable = [p for p in placements if cap is None or p.price_per_hour <= cap]
        if placements and not affordable:
            assert cap is not None
            cheapest = min(placements, key=lambda p: p.price_per_hour)
            too_dear.append((cap, cheapest))
            costly = ProvisionError(over_cap(cap, cheapest), BlockScope.PROVIDER)
            refusals.append((index, Attempt(str(candidate.resources.infra),
                                            candidate.resources.display(num_nodes),
                                            costly.message, str(costly.scope)), costly))
            return
        options.extend(Option(p, request, candidate.rank, tuple(warnings))
                       for p in affordable)

    async with anyio.create_task_group() as group:
        for index, candidate in enumerate(found):
            group.start_soon(one, index, candidate)
    refusals.sort(key=lambda r: r[0])
    if not options and len(found) == 1 and refusals:
        raise refusals[0][2]
    if not options and too_dear and len(too_dear) == len(refusals):
        # Refused for the price alone, everywhere: the cheapest of all is the one to name.
        cap, cheapest = min(too_dear, key=lambda c: c[1].price_per_hour)
        raise ProvisionError(over_cap(cap, cheapest), BlockScope.PROVIDER,
                             "raise resources.max_hourly_cost, or ask for less")
    fatal = [exc for _, _, exc in refusals if exc.scope == BlockScope.FATAL]
    if not options and fatal and len(fatal) == len(refusals) == 1:
        raise fatal[0]
    return (order_options(options, ordered, providers.preference),
            [attempt for _, attempt, _ in refusals])
