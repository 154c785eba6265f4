"""Ops of managed jobs (`clusterctl jobs ...`): check the input, one controller call each."""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.managed.controller import ManagedJobController
from clusterd.managed.recovery import policy_from_yaml
from clusterd.managed.store import ManagedJobStore, SubmittedTask
from clusterd.providers.registry import ProviderRegistry
from clusterd.tasks.loader import _read as read_task_file
from clusterd.tasks.spec import Infra, TaskSpec

from .connection import Call

MAX_ID = 2**62
MAX_TAIL = 2**62  # an SQL LIMIT must fit in 64 bits
# The loader's warning for these fields says clusterd runs no managed jobs; here it does.
RECOVERY_FIELDS = ("resources.job_recovery", "resources.spot_recovery")


class ManagedHandlers:
    def __init__(self, controller: ManagedJobController, store: ManagedJobStore,
                 providers: ProviderRegistry,
                 cost_of: Callable[[int], float] | None = None) -> None:
        self._cost_of = cost_of  # a managed job's cost so far (jobs queue's column)
        self._controller = controller
        self._store = store
        self._providers = providers

    def table(self) -> dict[str, Any]:
        return {
            protocol.JobsLaunchArgs.op: self.launch,
            protocol.JobsQueueArgs.op: self.queue,
            protocol.JobsLogsArgs.op: self.logs,
            protocol.JobsEventsArgs.op: self.events,
            protocol.JobsCancelArgs.op: self.cancel,
        }

    def refuse_down(self, cluster: str) -> None:
        """`down` of a managed job's cluster: the job owns it; cancel the job instead."""
        self._refuse(cluster, "cancel the job instead (its cluster goes with it)")

    def refuse_launch(self, cluster: str) -> None:
        """A user's `launch` onto the name of an unfinished managed job's cluster, made yet
        or not: the job would find it taken, and the user's task would run on the job's."""
        self._refuse(cluster, "pick another cluster name, or cancel the job")

    def _refuse(self, cluster: str, hint: str) -> None:
        owner = self._store.owner_of(cluster)
        if owner is not None:
            raise ProtocolError(
                ErrorCode.MANAGED_CLUSTER,
                f"cluster {cluster} belongs to managed job {owner.id} ({owner.status})",
                f"{hint}: clusterctl jobs cancel {owner.id}")

    def mark_owned(self, views: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """`status` views, those of managed jobs' clusters with `managed_job` (the id). The
        views are cached and shared, so marked ones are copies."""
        owners = {r.cluster: r.id for r in self._store.active()}
        if not owners:
            return views
        return [{**v, "managed_job": owners[v["name"]]} if v["name"] in owners else v
                for v in views]

    async def launch(self, call: Call, args: protocol.JobsLaunchArgs,
                     task: TaskSpec) -> dict[str, Any]:
        """`task` is loaded by the caller, as for `launch`."""
        if not task.run:
            raise ProtocolError(ErrorCode.INVALID_TASK, f"{task.source}: run: nothing to run",
                                "a managed job runs the task's run commands; give some")
        # Refused now, not at the job's first launch: what no launch could ever do.
        override = Infra.parse(args.infra) if args.infra else None
        for where in [override] if override and override.provider else \
                [r.infra for r in task.resource_options()]:
            if where.provider:
                self._providers.get(where.provider)  # an unknown provider, by name
        if task.name is not None and not _makes_cluster_name(task.name):
            raise ProtocolError(
                ErrorCode.INVALID_NAME,
                f"managed job name {protocol.shown(task.name, 40)}: its cluster is named after "
                "it, and a cluster name is ASCII letters, digits, '-', '_' and '.'",
                "give a name in those letters (-n NAME)")
        yaml_text = args.yaml_text
        if args.yaml_path is not None:
            # Kept as read now: the file may change or go before a recovery loads it again.
            yaml_text = read_task_file(Path(os.path.join(args.cwd, args.yaml_path)),
                                       args.yaml_path)
        policy_from_yaml(yaml_text, task.source)  # refused now, not at the first failure
        task = _without_recovery_warnings(task)
        # The loader takes secret environment variables (GIT_TOKEN) out of `envs` into the
        # secrets wherever they were written, --env too; the record keeps only their names.
        envs = {k: v for k, v in args.envs.items() if k not in task.secrets}
        submitted = SubmittedTask.storable(
            yaml_text=yaml_text, command=args.command, source=task.source, cwd=args.cwd,
            envs=envs, secret_names=tuple(sorted(task.secrets)),
            num_nodes=args.num_nodes, cpus=args.cpus, name=args.name, infra=args.infra,
            resources=requested_resources(task))
        record = await self._controller.submit(task, submitted)
        for warning in task.warnings:
            await call.emit("progress", {"phase": "warning", "message": f"warning: {warning}",
                                         "elapsed": 0})
        await call.emit("managed_job", {"job_id": record.id, "cluster": record.cluster})
        if args.detach:
            return {"job_id": record.id, "cluster": record.cluster,
                    "status": str(record.status), "exit_code": int(protocol.ExitCode.SUCCEEDED)}
        return await self._controller.stream_log(record.id, True, call.emit)

    async def queue(self, call: Call, args: protocol.JobsQueueArgs) -> dict[str, Any]:
        result = self._controller.queue(args.all)
        if self._cost_of is not None:
            result["jobs"] = [{**job, "cost": self._cost_of(job["job_id"])}
                              for job in result["jobs"]]
        return result

    async def logs(self, call: Call, args: protocol.JobsLogsArgs) -> dict[str, Any]:
        job_id = self._newest() if args.job_id is None else args.job_id
        _check_id(job_id)
        if not 0 <= args.tail <= MAX_TAIL:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"tail must be from 0 (all) to {MAX_TAIL} lines")
        if args.controller:
            return await self._controller.stream_controller_log(job_id, args.follow,
                                                                call.emit, args.tail)
        return await self._controller.stream_log(job_id, args.follow, call.emit, args.tail)

    def _newest(self) -> int:
        """The newest managed job's id (`jobs logs` without one, as `logs` takes a
        cluster's latest job)."""
        records = self._store.all()
        if not records:
            raise ProtocolError(ErrorCode.MANAGED_JOB_NOT_FOUND, "there are no managed jobs",
                                "submit one: clusterctl jobs launch task.yaml")
        return max(r.id for r in records)

    async def events(self, call: Call, args: protocol.JobsEventsArgs) -> dict[str, Any]:
        _check_id(args.job_id)
        if not 0 <= args.after <= MAX_ID:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"after must be from 0 to {MAX_ID}")
        self._controller.require(args.job_id)
        events = await self._store.events(args.job_id, after=args.after)
        return {"job_id": args.job_id, "events": [dataclasses.asdict(e) for e in events]}

    async def cancel(self, call: Call, args: protocol.JobsCancelArgs) -> dict[str, Any]:
        if args.name is not None and (args.job_ids or args.all):
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                "name picks the job to cancel: give it without job ids or all")
        if not args.job_ids and not args.all and args.name is None:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, "name the managed jobs to cancel",
                                "give job ids, --all, or -n NAME")
        for job_id in args.job_ids:
            _check_id(job_id)
        if args.name is not None:
            return await self._cancel_by_name(args.name)
        return await self._controller.cancel(args.job_ids, args.all)

    async def _cancel_by_name(self, name: str) -> dict[str, Any]:
        """The one unfinished job of that name. Several: refused, as SkyPilot refuses it
        (a name is not an id: cancelling every job that shares one is `--all` by mistake)."""
        named = [r for r in self._store.all() if r.name == name]
        if not named:
            raise ProtocolError(ErrorCode.MANAGED_JOB_NOT_FOUND,
                                f"there is no managed job named {protocol.shown(name, 40)}",
                                "see `clusterctl jobs queue --all`")
        unfinished = [r.id for r in named if not r.status.is_final]
        if len(unfinished) > 1:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"{len(unfinished)} unfinished managed jobs are named "
                                f"{protocol.shown(name, 40)}: {', '.join(map(str, unfinished))}",
                                "cancel them by id: clusterctl jobs cancel ID...")
        if not unfinished:
            return {"cancelled": [], "already_finished": [r.id for r in named]}
        return await self._controller.cancel(unfinished, False)


def _makes_cluster_name(name: str) -> bool:
    """Whether a job name can give its cluster a name: one with a letter or digit, ASCII
    only (anything else would be dropped from the cluster's name, or refused there)."""
    return name.isascii() and name.isprintable() and any(c.isalnum() for c in name)


def _check_id(job_id: int) -> None:
    if not 1 <= job_id <= MAX_ID:
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"job_id must be from 1 to {MAX_ID}")


def requested_resources(task: TaskSpec) -> str:
    """What a job asks for, short: `1x[CPU:2]`, `2x[CPU:8, V100:1, spot]`; the instance
    type if it names one; `+N more` if it gives alternatives (any_of/ordered)."""
    shown = task.resources.display(task.num_nodes)
    extra = [task.resources.instance_type] if task.resources.instance_type else []
    if task.resources.use_spot:
        extra.append("spot")
    if extra:
        shown = f"{shown[:-1]}, {', '.join(extra)}]"
    if len(task.resource_choices) > 1:
        shown += f" +{len(task.resource_choices) - 1} more"
    return shown


def _without_recovery_warnings(task: TaskSpec) -> TaskSpec:
    kept = tuple(w for w in task.warnings if not w.startswith(RECOVERY_FIELDS))
    return dataclasses.replace(task, warnings=kept)
