"""Getting a cluster's nodes: one attempt after another until one works.

Each attempt writes where it is about to create (the intent: provider, region, zone) before the
provider's create call, so a daemon killed at any instant finds what it may have made. A
failed attempt removes what it created before the next one starts; leaving a region, it also
removes the cluster's per-region resources there (a security group). So the intent always
names the only place where anything of the cluster can exist.

With `retry_until_up`, a round in which every option failed is followed by a wait (growing,
capped) and a new round with nothing blocked. (`clusterctl down` calls a launch off in any
phase, this wait too: see ClusterService.launch.)
"""

from __future__ import annotations

import collections
import dataclasses
import secrets
import statistics
import time
from collections.abc import Awaitable, Callable

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.faults import fault_point
from clusterd.providers.base import (
    BlockScope,
    Provider,
    ProviderHandle,
    ProvisionError,
)
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.failover import Attempt, Failover, Option, Steering, format_table
from clusterd.provision.plan import LaunchPlan, Where, where
from clusterd.requests import RunningRequest
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.state.handles import ClusterHandle
from clusterd.tasks.spec import Resources

logger = log.get("clusterd.provision")

# Why new nodes on a provider are refused now (a budget exceeded), or None.
Refusal = Callable[[str], Awaitable[ProvisionError | None]]


async def no_refusal(provider: str) -> ProvisionError | None:
    return None


@dataclasses.dataclass(frozen=True)
class Provisioned:
    record: ClusterRecord
    provider: Provider
    handle: ProviderHandle
    resources: Resources  # what the winning option asked for (its candidate's resources)
    warnings: tuple[str, ...] = ()  # task fields without effect where it landed


class Provisioner:
    def __init__(self, store: ClusterStore, providers: ProviderRegistry, *,
                 wait_timeout_s: float, retry_gap_s: float, retry_max_gap_s: float) -> None:
        self._store = store
        self._providers = providers
        self._wait_timeout_s = wait_timeout_s
        self._retry_gap_s = retry_gap_s
        self._retry_max_gap_s = retry_max_gap_s
        # For benchmarks (ping shows them): time spent deciding per attempt, outside the
        # providers' calls, and time spent inside those calls.
        self.decision_seconds: collections.deque[float] = collections.deque(maxlen=1000)
        self.provider_seconds = 0.0
        self.attempts = 0
        # Why new nodes on a provider are refused now (a budget exceeded: the budget
        # controller sets this), or None.
        self.refusal: Refusal = no_refusal

    def stats(self) -> dict[str, float]:
        decisions = list(self.decision_seconds) or [0.0]
        return {"attempts": self.attempts,
                "decision_ms_p50": round(statistics.median(decisions) * 1000, 3),
                "decision_ms_max": round(max(decisions) * 1000, 3),
                "provider_seconds": round(self.provider_seconds, 3)}

    async def provision(
        self, request: RunningRequest, record: ClusterRecord, plan: LaunchPlan, *,
        first: tuple[list[Option], list[Attempt]] | None = None,
        retry_until_up: bool = False, steering: Steering | None = None,
    ) -> Provisioned:
        """Nodes for `record`, from the first option that works (`plan` gives the options
        of each round; `first`, if given, is its first round already; `steering` orders and
        narrows round one for a relaunch)."""
        gap = self._retry_gap_s
        options, refusals = first if first is not None else await plan.round(
            self._providers)
        failover = Failover(options, refusals, steering)
        resumed = _resumed_token(record)
        while True:
            for option in failover:
                decided = time.monotonic()
                provider = self._providers.get(option.placement.provider)
                # Fresh for every attempt but the one resuming at the intent: a token that
                # was on a resource once is readable by anyone who can list them.
                token = resumed.pop(where(option.placement), None) or secrets.token_urlsafe(24)
                outcome = await self._attempt(request, record, provider, option, failover,
                                              decided, token)
                if isinstance(outcome, Provisioned):
                    return outcome
                record = outcome
            if not retry_until_up:
                raise _unavailable(record.name, failover)
            text = (f"round {failover.round} found no capacity ({len(failover.history)} "
                    f"attempts so far); trying again in {gap:.0f} s")
            await request.progress(text, "retry")
            await self._store.add_event(record.name, "provision", text, request.id)
            await anyio.sleep(gap)
            gap = min(gap * 1.5, self._retry_max_gap_s)
            failover.new_round(*await plan.round(self._providers))

    async def wait_for_nodes(self, record: ClusterRecord, provider: Provider,
                             handle: ProviderHandle) -> tuple[ClusterRecord, ProviderHandle]:
        """The nodes of a launch interrupted after its create, once they run (a daemon killed
        while they were still starting left a handle without their addresses)."""
        try:
            with anyio.fail_after(self._wait_timeout_s):
                waited = await provider.wait(record.cloud_name, handle, self._wait_timeout_s)
        except TimeoutError:
            raise ProvisionError(
                f"the nodes of {record.name} were not up within {self._wait_timeout_s:.0f} s",
                BlockScope.FATAL, f"`clusterctl down {record.name}` removes them") from None
        if waited != handle:
            record = await self._store.update(
                record.name, handle=dataclasses.replace(record.handle, provider=waited))
        return record, waited

    async def _attempt(
        self, request: RunningRequest, record: ClusterRecord, provider: Provider,
        option: Option, failover: Failover, decided: float, token: str,
    ) -> ClusterRecord | Provisioned:
        placement = option.placement
        refused = await self.refusal(placement.provider)
        if refused is not None:  # before anything is made or recorded
            if refused.scope == BlockScope.FATAL:
                raise refused
            line = failover.failed(option, refused, time.monotonic())
            await request.progress(line, "failover")
            return record
        # The price is said before anything is made: the whole cluster's, per hour (where
        # the placement has one: the catalog's).
        hourly = placement.price_per_hour * option.request.num_nodes
        await request.progress(f"creating nodes on {placement.describe()}"
                               + (f", ${hourly:.4g}/h for the cluster" if hourly else ""),
                               "provision")
        record = await self._store.update(
            record.name, provider=provider.name, launched_resources=placement,
            handle=ClusterHandle(intent=placement, create_token=token))
        self.attempts += 1
        started = time.monotonic()
        deciding = started - decided
        handle: ProviderHandle | None = None
        await fault_point("launch.before_create")
        try:
            created = await provider.create(
                dataclasses.replace(option.request, create_token=token), placement)
            handle = created
            await fault_point("launch.after_create")
            record = await self._store.update(
                record.name, handle=ClusterHandle(intent=placement, provider=created,
                                                   create_token=token))
            await fault_point("launch.waiting")
            with anyio.fail_after(self._wait_timeout_s):
                handle = await provider.wait(record.cloud_name, created, self._wait_timeout_s)
            if handle != created:
                # What only running nodes tell (addresses) is on disk before the runtime
                # starts: a teardown of a launch that fails from here on finds them.
                record = await self._store.update(
                    record.name, handle=ClusterHandle(intent=placement, provider=handle,
                                                      create_token=token))
            if option.request.resources.ports:
                await provider.open_ports(record.cloud_name, handle,
                                          option.request.resources.ports)
        except TimeoutError:
            error = ProvisionError(f"{placement.describe()}: the nodes were not up within "
                                   f"{self._wait_timeout_s:.0f} s", BlockScope.ZONE)
        except ProvisionError as exc:
            error = exc
        else:
            self.provider_seconds += time.monotonic() - started
            self.decision_seconds.append(deciding)
            failover.succeeded(option, started)
            return Provisioned(record, provider, handle, option.request.resources,
                               option.warnings)
        noted = time.monotonic()
        self.provider_seconds += noted - started
        line = failover.failed(option, error, started)
        await request.progress(line, "failover")
        await self._store.add_event(record.name, "provision", line, request.id)
        cleaning = time.monotonic()
        await self._clean_up(record, provider, option, failover,
                             handle or provider.handle_for_intent(record.cloud_name, placement))
        cleaned = time.monotonic()
        self.provider_seconds += cleaned - cleaning
        self.decision_seconds.append(deciding + (cleaning - noted))
        if error.scope == BlockScope.FATAL:
            raise error
        return record

    async def _clean_up(self, record: ClusterRecord, provider: Provider, option: Option,
                        failover: Failover, handle: ProviderHandle) -> None:
        """Remove what the failed attempt made; leaving its region, the per-region resources
        too (the next attempt in the same region reuses them). Not for a repair (the request
        names the cluster's nodes before it): a terminate takes the whole cluster, and the
        nodes that survived hold the user's data; the provider's create removes what its
        own failed call made, and what a later step left is the cluster's, tagged and
        recorded, for the next launch to complete or `down` to remove."""
        if option.request.previous is not None:
            return
        with anyio.CancelScope(shield=True):
            try:
                await provider.terminate(record.cloud_name, handle)
            except ProtocolError as exc:
                # Going on elsewhere would lose track of what this attempt made: stop here
                # (the record keeps the intent, so `down` can try again).
                raise ProvisionError(
                    f"cannot remove what the attempt on {option.describe()} made: "
                    f"{exc.message}", BlockScope.FATAL,
                    f"`clusterctl down {record.name}` tries again") from None
            upcoming = failover.next_option()
            here = (option.placement.provider, option.placement.region)
            if upcoming is None or (upcoming.placement.provider,
                                    upcoming.placement.region) != here:
                try:
                    await provider.cleanup_ports(record.cloud_name, handle)
                except ProtocolError as exc:
                    logger.warning("cleanup after a failed attempt failed", cluster=record.name,
                                   error=exc.message)


def _unavailable(name: str, failover: Failover) -> ProtocolError:
    return NoPlacement(name, failover.history)


class NoPlacement(ProtocolError):
    """RESOURCES_UNAVAILABLE, with the table of every attempt: where, what, and why not."""

    def __init__(self, name: str, attempts: list[Attempt]) -> None:
        count = len(attempts)
        super().__init__(
            ErrorCode.RESOURCES_UNAVAILABLE,
            f"no place could run {name} ({count} attempt{'s' if count != 1 else ''}):\n"
            + format_table(attempts),
            "ask for other resources or regions, or keep trying with --retry-until-up",
        )
        # Some place refused for the request rate, not for capacity: worth waiting out.
        self.throttled = any(attempt.throttled for attempt in attempts)



def _resumed_token(record: ClusterRecord) -> dict[Where, str]:
    """The create token of an attempt the daemon left before its create answered, by where
    it was creating (resumed there, the create knows what it made then)."""
    handle = record.handle
    if handle.provider is not None or handle.intent is None or not handle.create_token:
        return {}
    return {where(handle.intent): handle.create_token}
