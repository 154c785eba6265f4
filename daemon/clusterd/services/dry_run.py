"""`launch --dryrun` and `exec --dryrun`: the plan, and nothing made.

The same planning a launch does (provision/plan.py's `decide`, the candidates and the
failover order with the catalog's prices, the check of a task against an existing cluster,
the check of what its copies would send), stopped before the first thing that acts: no
cluster record, no request, no lock, no provider call that creates anything, no copy. Its
answer is one map (docs/protocol.md, "dryrun").
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

from clusterd import rsync
from clusterd.commands import rsync_source
from clusterd.cost.prices import Prices
from clusterd.providers.base import BlockScope, Placement, ProvisionError
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.candidates import candidates
from clusterd.provision.failover import Option
from clusterd.provision.launcher import NoPlacement
from clusterd.provision.plan import LaunchPlan, LaunchRequest, Observed, Step, decide
from clusterd.services.common import cloud_name_for, fit_to_cluster, require_cluster, require_up
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.tasks.file_sync import copies_of
from clusterd.tasks.spec import GitWorkdir, ResourceRequest, Resources, TaskSpec

# Beyond the chosen placement, the next places in the order a launch would try them.
ALTERNATIVES_SHOWN = 10
# What an existing cluster's step means, as the plan says it ({name}, {where}).
STEP_SAYS = {
    Step.REUSE: "cluster {name} is UP on {where}: reused as it is (its nodes and runtime are "
                "checked first, and repaired if they need it)",
    Step.START: "cluster {name} is STOPPED: started where it lives, on {where}",
    Step.RESUME: "cluster {name} was left INIT by an interrupted launch: the launch is resumed "
                 "(where it was making nodes first)",
    Step.REPAIR: "cluster {name} is INIT on {where}: its nodes are waited for and its runtime "
                 "started again",
    Step.UPGRADE: "cluster {name} on {where}: its runtime is upgraded",
    Step.RECREATE: "cluster {name} on {where}: its missing nodes are made again there",
}
# How an existing cluster would look to a launch that found it as recorded.
AS_RECORDED = Observed(lost_nodes=False, waited=True, runtime="healthy")


class CopyCheck(Protocol):
    """JobService.check_copies: refuses a copy that must not happen, warns of large ones."""

    async def __call__(self, task: TaskSpec, *, strict: bool) -> list[str]: ...


class Budgets(Protocol):
    """What the plan asks of the budgets (cost/budget_controller.py's BudgetController)."""

    async def refusal(self, provider: str) -> ProvisionError | None: ...

    async def standing(self, provider: str | None) -> list[dict[str, object]]: ...


class DryRun:
    def __init__(self, store: ClusterStore, providers: ProviderRegistry,
                 check_copies: CopyCheck, prices: Prices) -> None:
        self._store = store
        self._providers = providers
        self._check_copies = check_copies
        self._prices = prices
        # The budgets' verdict on a new cluster (the daemon plugs its controller in).
        self.budgets: Budgets | None = None

    async def launch(self, launch: LaunchRequest) -> dict[str, Any]:
        """What `launch` would do: the step for the cluster it names, where a new one would
        go (and at what price), what it would sync. Raises what the launch would raise
        before making anything (no placement, a task the cluster cannot run, ...)."""
        name, task = launch.name, launch.task
        warnings = [*task.warnings, *await self._check_copies(task, strict=launch.strict)]
        record = self._store.get(name)
        if record is None:
            plan = await self._new(launch)
            warnings += plan.pop("warnings")
        else:
            resources, fitting = fit_to_cluster(
                record, task, self._providers.honoured_fields(record.provider), launch.infra,
                launch.strict)
            warnings += fitting
            step = decide(launch, record, AS_RECORDED)
            plan = self._existing(record, step, STEP_SAYS[step], resources)
        autostop = launch.autostop
        return {**plan, **await self._task(task, run_setup=True),
                "autostop": None if autostop is None else dataclasses.asdict(autostop),
                "warnings": list(dict.fromkeys(warnings))}

    async def exec(self, name: str, task: TaskSpec, *, strict: bool) -> dict[str, Any]:
        """What `exec` would do: the same checks, and the job it would queue."""
        record = require_up(require_cluster(self._store, name))
        warnings = [*task.warnings, *await self._check_copies(task, strict=strict)]
        resources, fitting = fit_to_cluster(
            record, task, self._providers.honoured_fields(record.provider), strict=strict)
        plan = self._existing(record, "run", f"a job on cluster {name} (UP, on "
                                             f"{_where(record)}); its setup is not run",
                              resources)
        return {**plan, **await self._task(task, run_setup=False),
                "warnings": list(dict.fromkeys([*warnings, *fitting]))}

    async def _new(self, launch: LaunchRequest) -> dict[str, Any]:
        found = await candidates(launch.task.resource_options(), launch.infra, self._providers)
        plan = LaunchPlan.new(launch, cloud_name_for(launch.name), found)
        options, refusals = await plan.round(self._providers)
        if not options and not launch.retry_until_up:
            raise NoPlacement(launch.name, refusals)
        nodes = launch.task.num_nodes
        options, budget = await self._budget(options)
        chosen = options[0] if options else None
        says = f"a new cluster {launch.name}"
        if budget is not None and budget["refused"]:
            says += ": refused by a budget"
        elif not chosen:
            says += ": nowhere has room now; --retry-until-up would wait"
        return {
            "dryrun": True, "cluster": launch.name, "exists": False, "step": str(Step.NEW),
            "says": says,
            "placement": self._placement(chosen.placement, chosen.request.resources, nodes)
            if chosen else None,
            "resources": launch.task.resources.display(nodes),
            "requested": _requested(chosen.request.resources if chosen
                                    else launch.task.resources),
            "alternatives": [self._placement(o.placement, o.request.resources, nodes)
                             for o in options[1:1 + ALTERNATIVES_SHOWN]],
            "more_alternatives": max(0, len(options) - 1 - ALTERNATIVES_SHOWN),
            "refused": [{"infra": a.infra, "resources": a.resources, "reason": a.reason}
                        for a in refusals],
            "budget": budget,
            "warnings": list(chosen.warnings) if chosen else [],
        }

    async def _budget(self, options: list[Option]) -> tuple[list[Option], dict[str, Any] | None]:
        """The budgets' verdict, as the launch would meet it before each create: the
        options left (a provider's exceeded budget skips its places), and `{refused (why
        the launch would be refused, or null), skipped: [{provider, reason}], budgets: what
        each budget counting the chosen place has left}`; None with no budget configured."""
        if self.budgets is None:
            return options, None
        refused: dict[str, ProvisionError | None] = {}
        for option in options:
            provider = option.placement.provider
            if provider not in refused:
                refused[provider] = await self.budgets.refusal(provider)
        fatal = next((e for e in refused.values() if e and e.scope == BlockScope.FATAL), None)
        kept = [o for o in options if refused[o.placement.provider] is None]
        skipped = [{"provider": p, "reason": e.message} for p, e in refused.items() if e]
        standing = await self.budgets.standing(kept[0].placement.provider if kept else None)
        if not standing and not skipped:
            return options, None
        why = fatal.message if fatal else (skipped[0]["reason"] if options and not kept
                                           else None)
        return ([] if fatal else kept), {"refused": why, "skipped": [] if fatal else skipped,
                                         "budgets": standing}

    async def _task(self, task: TaskSpec, *, run_setup: bool) -> dict[str, Any]:
        return {
            "task": {"name": task.name, "num_nodes": task.num_nodes,
                     "setup": run_setup and task.setup is not None, "run": task.run is not None,
                     "ports": list(task.resources.ports), "envs": sorted(task.envs),
                     "secrets": sorted(task.secrets)},
            "sync": await _sync(task),
            "buckets": [{"remote": b.remote, "url": b.url, "mode": b.mode}
                        for b in task.bucket_mounts],
        }


    def _existing(self, record: ClusterRecord, step: str, says: str,
                  resources: Resources) -> dict[str, Any]:
        placed = record.launched_resources
        return {
            "dryrun": True, "cluster": record.name, "exists": True,
            "status": str(record.status), "step": str(step),
            "says": says.format(name=record.name, where=_where(record)),
            "placement": self._placement(placed, record.requested_resources.resources,
                                         record.num_nodes) if placed else None,
            "resources": resources.display(record.num_nodes),
            "requested": _requested(resources),
            "alternatives": [], "more_alternatives": 0, "refused": [], "budget": None,
        }

    def _placement(self, placement: Placement, resources: Resources,
                   num_nodes: int) -> dict[str, Any]:
        """A place, with its price per node and for the whole cluster (per hour: the
        catalog's, a pool's price_per_hour, kubernetes.pricing; 0 where nothing is charged,
        as on local) and where that price comes from (cost/prices.py, as the ledger
        counts it)."""
        source = self._prices.node(placement, ResourceRequest(resources)).source
        return {**dataclasses.asdict(placement), "infra": placement.infra,
                "cluster_price_per_hour": placement.price_per_hour * num_nodes,
                "price_source": source}


def _where(record: ClusterRecord) -> str:
    placed = record.launched_resources
    return placed.describe() if placed is not None else record.provider


def _requested(resources: Resources) -> dict[str, Any]:
    """The resource fields the task (with its flags) sets: those not at their default."""
    unset = Resources().provisioning_view()
    return {key: value for key, value in resources.provisioning_view().items()
            if value != unset[key]}


async def _sync(task: TaskSpec) -> list[dict[str, Any]]:
    """What would be copied to every node: each copy with its file count and bytes, as
    rsync's own dry run (with the copy's filters) counts them; a git workdir is cloned."""
    found: list[dict[str, Any]] = []
    if isinstance(task.workdir, GitWorkdir):
        found.append({"field": "workdir", "source": task.workdir.url,
                      "ref": task.workdir.ref, "files": None, "bytes": None})
    for copy in copies_of(task):
        transfer = await rsync.planned(copy.rsync_args, rsync_source(copy.source))
        found.append({"field": copy.field, "source": copy.source, "files": transfer.files,
                      "bytes": transfer.total_bytes})
    return found
