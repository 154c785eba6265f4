"""Launch as one plan: what a launch asks for, what to do with the cluster it names, and where
a new cluster's nodes may go.

`decide(request, record, observed)` is the one place that chooses the step for a cluster; it
is pure (no I/O), so every rule is here to read and test. The services execute its steps and
call it again with what they observed (`CHECK_NODES`, `CHECK_RUNTIME`, `WAIT` are steps that
only look or wait; every other step ends the launch's provisioning part). Nothing in
`provision/` calls back into the services: a `LaunchPlan` is data, and the Provisioner asks it
for each round's options itself.

Crash safety. Each step's rule says what is on disk before it acts and what a `kill -9` at any
point in it leaves for the next launch (or the refresh loop) to find; the rule that makes all
of them work is the launcher's: the intent (provider, region, zone, create token) is written
before any create call, and the provider's handle right after it answers (launcher.py).
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Literal

from clusterctl.protocol import ClusterStatus, ErrorCode, ProtocolError
from clusterd.providers.base import ClusterRequest, Placement
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.candidates import Candidate, candidates, plan
from clusterd.provision.failover import Attempt, Option, Steering
from clusterd.state.clusters import ClusterRecord
from clusterd.tasks.spec import Autostop, Infra, Resources, TaskSpec

# How a cluster's runtime answered: "other version" is an agent of another clusterd.
Health = Literal["healthy", "other version", "unhealthy"]


@dataclasses.dataclass(frozen=True)
class LaunchRequest:
    """One launch, typed: a user's (built from the wire's LaunchArgs by the handler) or a
    managed job's (built by its controller). Both enter ClusterService.launch with it."""

    name: str
    task: TaskSpec
    infra: Infra | None = None  # --infra: overrides where each of the task's choices goes
    autostop: Autostop | None = None
    retry_until_up: bool = False
    strict: bool = False  # refuse task fields that would have no effect (else: warnings)
    steering: Steering | None = None  # a managed job's relaunch: orders the first round
    # Who launches: None for the user; a managed job's tag. Recorded as a new cluster's
    # creator; only the same owner may use an existing cluster (see refuse_other_owner).
    owner: str | None = None


def autostop_for(idle_minutes: float | None, down: bool, task: TaskSpec) -> Autostop | None:
    """The autostop a launch sets: its flags over the task's `resources.autostop`."""
    if idle_minutes is not None:  # checked (finite, in range) by the handler
        return Autostop(idle_minutes, down)
    if task.resources.autostop is not None:
        setting = task.resources.autostop
        return dataclasses.replace(setting, down=setting.down or down)
    if down:
        return Autostop(0, True)  # SkyPilot's --down alone: tear down once idle
    return None


def refuse_other_owner(record: ClusterRecord | None, owner: str | None) -> None:
    """A launch (`owner` None: the user's; else a managed job's tag) may use an existing
    cluster only if the same owner made it: a name clash never lets one take the other's."""
    if record is None or record.owner == owner:
        return
    if record.owner is None:
        raise ProtocolError(
            ErrorCode.MANAGED_CLUSTER,
            f"cluster {record.name} exists and {owner} did not make it: it is left alone",
            "a managed job uses only a cluster it made; submit the job again for a new name")
    raise ProtocolError(
        ErrorCode.MANAGED_CLUSTER,
        f"cluster {record.name} was made by {record.owner} and only it may launch there",
        "pick another cluster name, or cancel that managed job (its cluster goes with it)")


class Step(enum.StrEnum):
    """What a launch (or `start`) does next with the cluster it names."""

    # No record. Writes the record (INIT, the provider-side name) before any create; each
    # attempt's intent is on disk before its create (launcher.py). Killed here: the record
    # stays INIT with the intent, and the next launch RESUMEs (refresh finds the nodes, or
    # `down` sweeps the intent's place). A failure removes what it made, then the record.
    NEW = "new"
    # STOPPED: the provider starts the nodes where they live, then the runtime. Killed here:
    # the record is still STOPPED; the next launch starts it again (a start is idempotent)
    # and the refresh loop sees the nodes running meanwhile. Never moved elsewhere.
    START = "start"
    # A record with no provider handle: an earlier launch died before its create answered.
    # Provisions again with the interrupted attempt's place first and its create token (the
    # create is idempotent by it), so the nodes it may have made are reused, not leaked.
    # Killed here: the same state again (intent on disk), so the next launch resumes again.
    RESUME = "resume"
    # Ever UP and nodes are gone for good (a preempted spot node): makes them again where the
    # cluster lives (its disks hold data), with the survivors' handle as `previous`; the
    # handle is written back if the create fails, so the next launch repairs again rather
    # than resume a launch that made nothing. Killed here: the record holds the new handle
    # (or the old one), and the next launch checks the nodes again.
    RECREATE = "recreate"
    # Nodes there, runtime not healthy: starts the runtime again; the runtime's handle is
    # checkpointed before anything starts, so a kill leaves ports known to the next REPAIR.
    REPAIR = "repair"
    # A REPAIR that first stops an agent of another clusterd version.
    UPGRADE = "upgrade"
    # UP and healthy: nothing to do. Changes nothing.
    REUSE = "reuse"
    # Never UP, handle known: an earlier launch died after its create, before its nodes ran.
    # Waits for them and writes what only running nodes tell (addresses). Killed here: the
    # same state; the next launch waits again.
    WAIT = "wait"
    # Looks only (changes nothing): which nodes the provider still has.
    CHECK_NODES = "check nodes"
    # Looks only: whether the runtime answers, and in which version.
    CHECK_RUNTIME = "check runtime"


# The steps that end the provisioning part of a launch (the others look, then decide again).
FINAL = frozenset({Step.NEW, Step.START, Step.RESUME, Step.RECREATE, Step.REPAIR,
                   Step.UPGRADE, Step.REUSE})


@dataclasses.dataclass(frozen=True)
class Observed:
    """What the services saw of the cluster since the launch took its lock (None: not looked)."""

    lost_nodes: bool | None = None  # nodes of it are gone for good
    waited: bool = False  # its nodes run (WAIT done)
    runtime: Health | None = None


def decide(request: LaunchRequest | None, record: ClusterRecord | None,
           observed: Observed) -> Step:
    """The next step for the cluster `record` (None: none of that name). `request` is None
    for a `start`, which brings up what exists and has no owner to check. Raises
    MANAGED_CLUSTER for a cluster of another owner; CLUSTER_NOT_FOUND is the caller's."""
    if record is None:
        return Step.NEW
    if request is not None:
        refuse_other_owner(record, request.owner)
    if record.status == ClusterStatus.STOPPED:
        return Step.START
    if record.handle.provider is None:
        return Step.RESUME
    if record.ever_up:
        if observed.lost_nodes is None:
            return Step.CHECK_NODES
        if observed.lost_nodes:
            return Step.RECREATE
    elif not observed.waited:
        return Step.WAIT
    if observed.runtime is None:
        return Step.CHECK_RUNTIME
    if record.status == ClusterStatus.UP and observed.runtime == "healthy":
        return Step.REUSE
    return Step.UPGRADE if observed.runtime == "other version" else Step.REPAIR


def placement_of(record: ClusterRecord) -> Placement:
    """Where a cluster lives (as its record says it was placed): for a cluster that was UP,
    which a launch placed."""
    if record.launched_resources is None:
        raise ValueError(f"cluster {record.name} was never placed")
    return record.launched_resources


Where = tuple[str, str | None, str | None, str | None]


def where(placement: Placement) -> Where:
    return placement.provider, placement.region, placement.zone, placement.instance_type


def intent_first(options: list[Option], intent: Placement | None) -> list[Option]:
    """A launch resuming goes first where the interrupted one was creating nodes (they are
    reused there, not leaked)."""
    if intent is None:
        return options
    here = where(intent)
    first = [o for o in options if where(o.placement) == here]
    if not first and options:
        first = [Option(intent, options[0].request)]
    return first + [o for o in options if o not in first]


@dataclasses.dataclass(frozen=True)
class LaunchPlan:
    """Where one launch's nodes may go: the options of each round (the Provisioner asks for a
    new round after one in which everything failed, with `--retry-until-up`)."""

    name: str
    cloud_name: str
    num_nodes: int
    autostop_down: bool
    choices: tuple[Resources, ...] = ()  # the task's alternatives (looked up every round)
    found: tuple[Candidate, ...] | None = None  # or the candidates, found once
    ordered: bool = False
    strict: bool = False
    resume_at: Placement | None = None  # an interrupted attempt's place goes first
    only: Option | None = None  # in place: this and nothing else

    @classmethod
    def new(cls, request: LaunchRequest, cloud_name: str, found: list[Candidate]
            ) -> LaunchPlan:
        task = request.task
        return cls(request.name, cloud_name, task.num_nodes,
                   bool(request.autostop and request.autostop.down), found=tuple(found),
                   ordered=task.choices_ordered, strict=request.strict)

    @classmethod
    def resume(cls, record: ClusterRecord) -> LaunchPlan:
        """Where the record's own request may go, the interrupted attempt's place first."""
        requested = record.requested_resources
        return cls(record.name, record.cloud_name, record.num_nodes, record.autostop_down,
                   choices=requested.options(), ordered=requested.ordered,
                   resume_at=record.handle.intent)

    @classmethod
    def in_place(cls, record: ClusterRecord) -> LaunchPlan:
        """The cluster's missing nodes, where it lives and nowhere else."""
        placement = placement_of(record)
        resources = dataclasses.replace(
            record.requested_resources.resources,
            infra=Infra(placement.provider, placement.region, placement.zone))
        request = ClusterRequest(record.name, record.cloud_name, record.num_nodes, resources,
                                 autostop_down=record.autostop_down,
                                 previous=record.handle.provider)
        return cls(record.name, record.cloud_name, record.num_nodes, record.autostop_down,
                   only=Option(placement, request))

    async def round(self, providers: ProviderRegistry) -> tuple[list[Option], list[Attempt]]:
        """This round's options in the order to try them, and what providers refused."""
        if self.only is not None:
            return [self.only], []
        found = (list(self.found) if self.found is not None
                 else await candidates(self.choices, None, providers))
        options, refusals = await plan(found, providers, self.name, self.cloud_name,
                                       self.num_nodes, self.autostop_down, self.ordered,
                                       self.strict)
        return intent_first(options, self.resume_at), refusals
