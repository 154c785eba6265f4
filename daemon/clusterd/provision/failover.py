"""Failover: where to try next, and what a failure rules out. Provider-independent.

The options of a launch are its candidates' placements: cheapest first across every candidate
(SkyPilot's `any_of`, and a task naming one or no provider), or candidate by candidate in the
user's order (`ordered`), each candidate's placements cheapest first. A failure blocks what its
ProvisionError's scope rules out (the zone, the region or the whole provider: the provider
says which, where it maps its library's errors) for the rest of the round; a fatal one ends
the launch. Every attempt is kept, so a launch that found
nothing can say where it looked and why each place failed.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Iterator

from clusterctl.protocol import clipped
from clusterd.providers.base import (
    BlockScope,
    ClusterRequest,
    Placement,
    ProvisionError,
    infra_label,
)


@dataclasses.dataclass(frozen=True)
class Option:
    """One place to try: a placement, and the request as its candidate shapes it."""

    placement: Placement
    request: ClusterRequest
    rank: int = 0  # the candidate's position in an `ordered` list (0 otherwise)
    # Fields of the task that have no effect on this option's provider (see tasks.fields).
    warnings: tuple[str, ...] = ()

    def describe(self) -> str:
        return self.placement.describe()


@dataclasses.dataclass(frozen=True)
class Attempt:
    infra: str  # provider[/region[/zone]]
    resources: str  # the instance type, or the request's shape where there is none
    reason: str
    scope: str | None  # what it blocked: zone, region, provider, fatal; None for success
    seconds: float = 0.0
    throttled: bool = False  # the provider limited the request rate (ProvisionError.throttled)

    def to_wire(self) -> dict[str, object]:
        return dataclasses.asdict(self)


def resources_of(option: Option) -> str:
    placement = option.placement
    if placement.instance_type:
        return placement.instance_type + (" (spot)" if placement.spot else "")
    return option.request.resources.display(option.request.num_nodes)


class Blocklist:
    def __init__(self) -> None:
        self._placements: set[Placement] = set()
        self._zones: set[tuple[str, str | None, str | None]] = set()
        self._regions: set[tuple[str, str | None]] = set()
        self._providers: set[str] = set()

    def add(self, placement: Placement, scope: BlockScope) -> None:
        if scope == BlockScope.PLACEMENT:
            self._placements.add(placement)
        elif scope == BlockScope.ZONE:
            self._zones.add((placement.provider, placement.region, placement.zone))
        elif scope == BlockScope.REGION:
            self._regions.add((placement.provider, placement.region))
        elif scope == BlockScope.PROVIDER:
            self._providers.add(placement.provider)

    def block_provider(self, provider: str) -> None:
        self._providers.add(provider)

    def blocks(self, placement: Placement) -> bool:
        return (placement in self._placements
                or placement.provider in self._providers
                or (placement.provider, placement.region) in self._regions
                or (placement.provider, placement.region, placement.zone) in self._zones)

    def clear(self) -> None:
        self._placements.clear()
        self._zones.clear()
        self._regions.clear()
        self._providers.clear()


@dataclasses.dataclass(frozen=True)
class Steering:
    """What a relaunch knows that a fresh launch does not (a managed job's recovery): a
    region to try first, and the places its first round skips because the job was just lost
    there. Later rounds try everything, so capacity that comes back there is used."""

    first_region: tuple[str, str | None] | None = None  # (provider, region)
    avoid: tuple[tuple[Placement, BlockScope], ...] = ()

    def order(self, options: list[Option]) -> list[Option]:
        """`options` with those in `first_region` first, each side in its own order."""
        if self.first_region is None:
            return options
        here = [o for o in options
                if (o.placement.provider, o.placement.region) == self.first_region]
        return here + [o for o in options if o not in here]

    def describe(self) -> str:
        parts = []
        if self.first_region is not None:
            parts.append(f"{infra_label(*self.first_region)} first")
        for placement, scope in self.avoid:
            zone = None if scope == BlockScope.REGION else placement.zone
            parts.append(f"not {infra_label(placement.provider, placement.region, zone)}")
        return ", ".join(parts) or "anywhere"


def order_options(options: list[Option], ordered: bool,
                  preference: Callable[[str], int]) -> list[Option]:
    """Cheapest first (whole cluster per hour), ties by provider `preference` (lower first),
    then as the provider listed them; with `ordered`, by the candidate's rank first."""
    def key(indexed: tuple[int, Option]) -> tuple[int, float, int, int]:
        index, option = indexed
        placement = option.placement
        price = placement.price_per_hour * option.request.num_nodes
        return (option.rank if ordered else 0, price, preference(placement.provider), index)

    return [option for _, option in sorted(enumerate(options), key=key)]


class Failover:
    """One launch's walk through its options, round after round."""

    def __init__(self, options: list[Option], refusals: list[Attempt] | None = None,
                 steering: Steering | None = None) -> None:
        self._steering = steering or Steering()
        self.options = self._steering.order(options)
        self.blocklist = Blocklist()
        for placement, scope in self._steering.avoid:
            self.blocklist.add(placement, scope)
        # Attempts of every round, and the candidates refused before any attempt.
        self.history: list[Attempt] = list(refusals or [])
        self.round = 1
        self._position = 0

    def __iter__(self) -> Iterator[Option]:
        """The options of this round not yet blocked, in order (the blocklist is read at
        each step, so a failure skips what it rules out)."""
        self._position = 0
        while self._position < len(self.options):
            option = self.options[self._position]
            self._position += 1
            if not self.blocklist.blocks(option.placement):
                yield option

    def next_option(self) -> Option | None:
        """What comes after the option being tried, as things stand now."""
        for option in self.options[self._position:]:
            if not self.blocklist.blocks(option.placement):
                return option
        return None

    def failed(self, option: Option, error: ProvisionError, started: float) -> str:
        """Record a failed attempt, block what it rules out, and say what comes next: the
        progress line `aws/us-east-1/us-east-1a (p4d.24xlarge): Insufficient... — trying
        us-east-1b`."""
        self.blocklist.add(option.placement, error.scope)
        self.history.append(Attempt(option.placement.infra, resources_of(option),
                                    error.message, str(error.scope),
                                    round(time.monotonic() - started, 3), error.throttled))
        line = f"{option.describe()}: {_first_line(error.message)}"
        if error.scope == BlockScope.FATAL:
            return line
        upcoming = self.next_option()
        if upcoming is None:
            return line + " — no other place to try"
        return line + f" — trying {_difference(option.placement, upcoming.placement)}"

    def succeeded(self, option: Option, started: float) -> None:
        self.history.append(Attempt(option.placement.infra, resources_of(option), "UP",
                                    None, round(time.monotonic() - started, 3)))

    def new_round(self, options: list[Option], refusals: list[Attempt]) -> None:
        """Everything failed: start over with these options and nothing blocked (capacity
        comes back, where a relaunch was steered away from too)."""
        self.options = self._steering.order(options)
        self.history.extend(refusals)
        self.blocklist.clear()
        self.round += 1

    def table(self) -> str:
        return format_table(self.history)


def format_table(attempts: list[Attempt]) -> str:
    rows = [("INFRA", "RESOURCES", "REASON")] + [
        (a.infra, a.resources, _first_line(a.reason, 140)) for a in attempts]
    widths = [max(len(row[i]) for row in rows) for i in range(2)]
    return "\n".join(f"{r[0]:<{widths[0]}}  {r[1]:<{widths[1]}}  {r[2]}" for r in rows)


def _first_line(text: str, limit: int = 200) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return clipped(line, limit)


def _difference(tried: Placement, upcoming: Placement) -> str:
    """The next place, named by what changes: the zone, the region, or the provider."""
    if upcoming.provider != tried.provider:
        return upcoming.infra
    if upcoming.region != tried.region:
        return infra_label(upcoming.region, upcoming.zone)
    if upcoming.zone != tried.zone and upcoming.zone:
        return upcoming.zone
    return upcoming.describe()
