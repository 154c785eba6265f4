"""Op → service call. Each handler checks its input, makes one service call, and shapes the
result; long work runs as a daemon-owned request the client merely follows."""

from __future__ import annotations

import math
import os
from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from clusterctl import protocol
from clusterctl._version import __version__
from clusterctl.protocol import WAIT_FOR_CHOICES, ErrorCode, OpArgs, ProtocolError
from clusterd.keptlogs.store import KeptLogStore
from clusterd.managed.controller import ManagedJobController
from clusterd.managed.store import ManagedJobStore
from clusterd.packing import Columns
from clusterd.providers.base import Provider
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.plan import LaunchRequest, autostop_for
from clusterd.requests import RequestManager, RunningRequest
from clusterd.services.autostop import AutostopService
from clusterd.services.clusters import ClusterService
from clusterd.services.common import check_name, generated_name, require_cluster
from clusterd.services.cost import CostService
from clusterd.services.jobs import JobService
from clusterd.services.nodes import node_views
from clusterd.services.orphans import OrphanWatch
from clusterd.services.refresh import RefreshService
from clusterd.services.usage import UsageService
from clusterd.state.clusters import ClusterStore
from clusterd.state.requests import RequestRecord, RequestState, RequestStore
from clusterd.storage.service import StorageService
from clusterd.tasks import fields
from clusterd.tasks.loader import MAX_IDLE_MINUTES, MAX_NUM_NODES, load_task
from clusterd.tasks.overrides import RESOURCE_OVERRIDES, apply_overrides
from clusterd.tasks.spec import Autostop, Infra, TaskSpec

from .connection import Call
from .cost_handlers import CostHandlers
from .history_handlers import HistoryHandlers
from .managed_handlers import ManagedHandlers
from .storage_handlers import StorageHandlers

Handler = Callable[[Call, Any], Awaitable[dict[str, Any]]]
MAX_EVENTS_LIMIT = 10_000
# Job ids and byte offsets travel as protobuf int64 to the agent.
MAX_ID = 2**62
MAX_TAIL_LINES = 1_000_000


def check_range(name: str, value: float | None, low: float, high: float) -> None:
    """INVALID_ARGUMENT for a number that is not finite or not within [low, high]."""
    if value is None:
        return
    if not math.isfinite(value) or not low <= value <= high:
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                            f"{name} must be a number from {low:g} to {high:g}, got "
                            f"{protocol.shown(value, 30)}")


class Handlers:
    def __init__(
        self,
        clusters: ClusterService,
        jobs: JobService,
        requests: RequestManager,
        store: ClusterStore,
        request_store: RequestStore,
        providers: ProviderRegistry,
        refresh: RefreshService,
        autostop: AutostopService,
        orphans: OrphanWatch,
        strict_by_default: Callable[[], bool] = lambda: False,
        *,
        managed: ManagedJobController,
        managed_store: ManagedJobStore,
        storage: StorageService,
        loop_stats: Callable[[], dict[str, Any]] = dict,
        usage: UsageService | None = None,
        kept: KeptLogStore | None = None,
        cost: CostService,
    ) -> None:
        self._usage = usage
        self._loop_stats = loop_stats
        self._history = HistoryHandlers(kept)
        self._cost = CostHandlers(cost, store)
        self._managed = ManagedHandlers(managed, managed_store, providers,
                                        self._cost.managed_job_cost)
        self._storage = StorageHandlers(storage)
        self._strict_by_default = strict_by_default
        self._orphans = orphans
        self._providers = providers
        self._refresh = refresh
        self._autostop = autostop
        self._clusters = clusters
        self._jobs = jobs
        self._requests = requests
        self._store = store
        self._request_store = request_store
        self._table: dict[str, Handler] = {
            protocol.PingArgs.op: self.ping,
            protocol.StatusArgs.op: self.status,
            protocol.LaunchArgs.op: self.launch,
            protocol.ExecArgs.op: self.exec,
            protocol.QueueArgs.op: self.queue,
            protocol.LogsArgs.op: self.logs,
            protocol.CancelArgs.op: self.cancel,
            protocol.StopArgs.op: self.stop,
            protocol.StartArgs.op: self.start,
            protocol.DownArgs.op: self.down,
            protocol.EventsArgs.op: self.events,
            protocol.RequestsArgs.op: self.list_requests,
            protocol.CheckArgs.op: self.check,
            protocol.AutostopArgs.op: self.autostop,
            protocol.ShowGpusArgs.op: self.show_gpus,
            protocol.FollowRequestArgs.op: self.follow_request,
            protocol.NodesArgs.op: self.nodes,
            protocol.NodeUsageArgs.op: self.node_usage,
            protocol.SSHArgs.op: self.ssh,
            protocol.JobsLaunchArgs.op: self.jobs_launch,
            **{op: handler for op, handler in self._managed.table().items()
               if op != protocol.JobsLaunchArgs.op},
            **self._storage.table(),
            **self._history.table(),
            **self._cost.table(),
        }
        missing = set(protocol.OPS) - set(self._table)
        assert not missing, f"ops without a handler: {missing}"

    async def dispatch(self, call: Call, args: OpArgs) -> dict[str, Any]:
        return await self._table[args.op](call, args)

    # -- quick ops ------------------------------------------------------------------------

    async def ping(self, call: Call, args: protocol.PingArgs) -> dict[str, Any]:
        return {
            "pong": True,
            "version": __version__,
            "pid": os.getpid(),
            "refresh": {"cycles": self._refresh.cycles,
                        "last_cycle_s": round(self._refresh.last_cycle_s, 3)},
            "provision": self._clusters.provision_stats(),
            "loop": self._loop_stats(),
        }

    async def status(self, call: Call, args: protocol.StatusArgs) -> dict[str, Any]:
        for name in args.clusters:
            require_cluster(self._store, name)
        if args.refresh:
            await self._refresh.refresh_now(args.clusters or None)
        result = self._clusters.views.status(args.clusters, args.verbose)
        result["clusters"] = self._managed.mark_owned(result["clusters"])
        # Beside the views, not in them: the views are cached per record, costs change by
        # the second. clusterctl shows them as each cluster's $/h and cost so far.
        result["costs"] = self._cost.live([v["name"] for v in result["clusters"]])
        if args.columns:
            result["clusters"] = Columns(result["clusters"])
        if not args.clusters:
            result["orphans"] = self._orphans.views()
        return result

    async def queue(self, call: Call, args: protocol.QueueArgs) -> dict[str, Any]:
        return await self._jobs.queue(args.cluster, args.skip_finished)

    async def cancel(self, call: Call, args: protocol.CancelArgs) -> dict[str, Any]:
        for job_id in args.job_ids:
            check_range("job_ids", job_id, 1, MAX_ID)
        return await self._jobs.cancel(args.cluster, args.job_ids, args.all)

    async def logs(self, call: Call, args: protocol.LogsArgs) -> dict[str, Any]:
        check_range("job_id", args.job_id, 1, MAX_ID)
        check_range("tail", args.tail, 0, MAX_TAIL_LINES)
        check_range("offset", args.offset, 0, MAX_ID)
        return await self._jobs.stream_logs(
            args.cluster, args.job_id, follow=args.follow, tail=args.tail, offset=args.offset,
            emit=call.emit, kept=True,
        )

    async def events(self, call: Call, args: protocol.EventsArgs) -> dict[str, Any]:
        if args.cluster:
            check_name(args.cluster)
        limit = max(1, min(args.limit, MAX_EVENTS_LIMIT))
        if not args.follow:
            events = await self._store.events(args.cluster, limit)
            if args.cluster and not events and self._store.get(args.cluster) is None:
                # Never made (a torn-down cluster keeps its history): not found, as for
                # every other command. --follow may wait for a cluster about to be made.
                require_cluster(self._store, args.cluster)
            return {"events": [e.to_wire() for e in events]}
        # Subscribe before reading the past, so nothing falls between the two.
        with self._store.subscribe() as live:
            shown = 0
            for event in await self._store.events(args.cluster, limit):
                await call.emit("cluster_event", event.to_wire())
                shown = max(shown, event.id)
            async for event in live:
                if event.id > shown and (args.cluster is None or event.cluster == args.cluster):
                    await call.emit("cluster_event", event.to_wire())
        raise ProtocolError(ErrorCode.INTERNAL, "the event stream fell too far behind",
                            "follow again")

    async def autostop(self, call: Call, args: protocol.AutostopArgs) -> dict[str, Any]:
        if args.cancel and (args.idle_minutes is not None or args.down):
            given = "idle minutes" if args.idle_minutes is not None else "down"
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"cancel removes autostop, and {given} sets it: give one",
                                "e.g. clusterctl autostop dev --cancel, or "
                                "clusterctl autostop dev -i 10")
        if args.cancel:
            setting = None
        else:
            if args.idle_minutes is None:
                raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                    "autostop needs idle minutes, or cancel",
                                    "e.g. clusterctl autostop dev -i 10, or --cancel")
            check_range("idle_minutes", args.idle_minutes, 0, MAX_IDLE_MINUTES)
            if args.wait_for not in WAIT_FOR_CHOICES:
                raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                    f"wait_for must be one of {', '.join(WAIT_FOR_CHOICES)}")
            setting = Autostop(args.idle_minutes, args.down, args.wait_for)
        require_cluster(self._store, args.cluster)
        request = await self._requests.start(
            args.op, args.cluster, protocol.to_wire(args),
            lambda r: self._autostop.configure(r, args.cluster, setting),
        )
        return await _follow(call, request)

    async def check(self, call: Call, args: protocol.CheckArgs) -> dict[str, Any]:
        """Every provider's answer under its name; the keys a provider says belong at the top
        of the reply (ssh's pools file and hosts) go there."""
        found: dict[str, dict[str, Any]] = {}
        # Those asked for (an unknown name refused by name), in the registry's order.
        asked = {self._providers.get(name.lower()).name for name in args.providers}
        providers = [p for p in self._providers.all() if not asked or p.name in asked]

        async def one(provider: Provider) -> None:
            found[provider.name] = await provider.check()

        async with anyio.create_task_group() as group:
            for provider in providers:
                group.start_soon(one, provider)
        result: dict[str, Any] = {"providers": {}}
        for provider in providers:
            answer = dict(found[provider.name])
            for key in provider.check_top_level:
                result[key] = answer.pop(key, None)
            result["providers"][provider.name] = answer
        return result

    async def show_gpus(self, call: Call, args: protocol.ShowGpusArgs) -> dict[str, Any]:
        """The accelerators of every provider that has a catalog of them."""
        if args.infra is not None:
            self._providers.get(args.infra)  # an unknown provider is refused, by name
        catalogs = [(provider.name, catalog) for provider in self._providers.all()
                    if args.infra in (None, provider.name)
                    and (catalog := await provider.accelerators()) is not None]
        check_range("count", args.count, 0, MAX_ID)
        rows = [{**row, "provider": name} for name, catalog in catalogs
                for row in catalog.accelerator_rows(args.name)]
        if args.name and not rows:
            shown = protocol.clipped(args.name, 40)
            known = dict.fromkeys(n for _, catalog in catalogs
                                  for n in catalog.accelerator_names())
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"no accelerator named {shown!r} in the catalog",
                                f"known: {', '.join(known)}")
        if args.count is not None:
            rows = _with_count(rows, args.count, args.name)
        return {"accelerators": rows}

    async def list_requests(self, call: Call, args: protocol.RequestsArgs) -> dict[str, Any]:
        running = [r.describe() for r in self._requests.running()]
        result: dict[str, Any] = {"running": running}
        if not args.active_only:
            result["recent"] = [r.to_wire() for r in await self._request_store.recent()]
        return result

    async def follow_request(self, call: Call,
                             args: protocol.FollowRequestArgs) -> dict[str, Any]:
        check_range("request_id", args.request_id, 1, MAX_ID)
        running = self._requests.get(args.request_id)
        if running is not None:
            return await _follow(call, running)
        record = await self._request_store.get(args.request_id)
        if record is None:
            raise ProtocolError(ErrorCode.REQUEST_NOT_FOUND,
                                f"request {args.request_id} does not exist",
                                "see `clusterctl requests --all`")
        # As when it was followed live: its request event, the steps it kept, its outcome.
        await call.emit("request", {"request_id": record.id, "op": record.op,
                                    "cluster": record.cluster})
        for name, data in record.steps or ():
            await call.emit(name, data)
        return _ended(record)

    async def nodes(self, call: Call, args: protocol.NodesArgs) -> dict[str, Any]:
        record = require_cluster(self._store, args.cluster)
        return {"cluster": record.name, "nodes": await node_views(self._providers, record)}

    async def node_usage(self, call: Call, args: protocol.NodeUsageArgs) -> dict[str, Any]:
        check_range("since", args.since, 0, 1e11)
        if self._usage is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED, "this clusterd samples no node use")
        return await self._usage.node_usage(args.cluster, args.since)

    async def ssh(self, call: Call, args: protocol.SSHArgs) -> dict[str, Any]:
        check_range("node", args.node, 0, MAX_NUM_NODES - 1)
        return await self._clusters.ssh_access(args.cluster, args.node)

    # -- long-running ops -----------------------------------------------------------------

    async def launch(self, call: Call, args: protocol.LaunchArgs) -> dict[str, Any]:
        name = check_name(args.cluster) if args.cluster else generated_name()
        self._managed.refuse_launch(name)
        check_range("idle_minutes", args.idle_minutes, 0, MAX_IDLE_MINUTES)
        args.strict = args.strict or self._strict_by_default()
        if args.yaml_path is None and args.yaml_text is None and args.command is None:
            # As `sky launch -c NAME`: bring an existing cluster up, run nothing.
            if self._store.get(name) is None:
                raise ProtocolError(
                    ErrorCode.INVALID_ARGUMENT,
                    f"launch needs a task to create cluster {name}",
                    f"give a task YAML or a command: `clusterctl launch -c {name} task.yaml` "
                    f"or `clusterctl launch -c {name} -- CMD`")
            task = await _load(protocol.LaunchArgs(**{**protocol.to_wire(args),
                                                      "yaml_text": "{}",
                                                      "source": "<no task>"}))
        else:
            task = await _load(args)
        if args.dryrun:  # the plan only: no request, no record, nothing made
            return await self._clusters.dry_run.launch(_launch_request(name, args, task))
        request = await self._requests.start(
            args.op, name, protocol.to_wire(args),
            # Built inside the request: a bad --infra fails the request, as it always has.
            lambda r: self._clusters.launch(r, _launch_request(name, args, task)),
        )
        return await self._follow_then_stream(call, request, args.detach)

    async def exec(self, call: Call, args: protocol.ExecArgs) -> dict[str, Any]:
        if not args.cluster:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT, "exec needs a cluster name")
        require_cluster(self._store, args.cluster)
        args.strict = args.strict or self._strict_by_default()
        task = await _load(args)
        if not task.run:
            raise ProtocolError(ErrorCode.INVALID_TASK, f"{task.source}: run: nothing to run",
                                "exec runs the task's run commands; give some")
        name = args.cluster
        if args.dryrun:
            return await self._clusters.dry_run.exec(name, task, strict=args.strict)
        request = await self._requests.start(
            args.op, name, protocol.to_wire(args),
            lambda r: self._jobs.exec(r, name, task, strict=args.strict),
        )
        return await self._follow_then_stream(call, request, args.detach)

    async def jobs_launch(self, call: Call, args: protocol.JobsLaunchArgs) -> dict[str, Any]:
        args.strict = args.strict or self._strict_by_default()
        task = await _load(args)
        return await self._managed.launch(call, args, task)

    async def stop(self, call: Call, args: protocol.StopArgs) -> dict[str, Any]:
        return await self._lifecycle(call, args, lambda r: self._clusters.stop(r, args.cluster))

    async def start(self, call: Call, args: protocol.StartArgs) -> dict[str, Any]:
        return await self._lifecycle(call, args, lambda r: self._clusters.start(r, args.cluster))

    async def down(self, call: Call, args: protocol.DownArgs) -> dict[str, Any]:
        if args.orphan:
            check_name(args.cluster)
            request = await self._requests.start(
                args.op, args.cluster, protocol.to_wire(args),
                lambda r: self._orphans.remove(r, args.cluster))
            return await _follow(call, request)
        self._managed.refuse_down(args.cluster)
        return await self._lifecycle(
            call, args, lambda r: self._clusters.down(r, args.cluster, args.purge,
                                                      call_off=True)
        )

    async def _lifecycle(
        self, call: Call, args: protocol.StopArgs | protocol.StartArgs | protocol.DownArgs,
        work: Callable[[RunningRequest], Awaitable[dict[str, Any]]],
    ) -> dict[str, Any]:
        require_cluster(self._store, args.cluster)
        request = await self._requests.start(args.op, args.cluster, protocol.to_wire(args), work)
        return await _follow(call, request)

    async def _follow_then_stream(
        self, call: Call, request: RunningRequest, detach: bool
    ) -> dict[str, Any]:
        result = await _follow(call, request)
        job_id = result.get("job_id")
        if job_id is None or detach:
            return {**result, "exit_code": int(protocol.ExitCode.SUCCEEDED)}
        streamed = await self._jobs.stream_logs(
            result["cluster"], job_id, follow=True, tail=0, offset=None, emit=call.emit
        )
        return {**result, **streamed}


def _with_count(rows: list[dict[str, Any]], count: float,
                name: str | None) -> list[dict[str, Any]]:
    """`show-gpus A100:8`: instance types with exactly that many (SkyPilot's filter), and
    nodes (kubernetes) with at least that many; none at all is refused with the counts that
    are there."""
    kept = [r for r in rows if (r["count"] >= count if "node" in r else r["count"] == count)]
    if rows and not kept:
        counts = sorted({r["count"] for r in rows if "node" not in r})
        shown = protocol.clipped(name or "an accelerator", 40)
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                            f"no instance type with {count:g} of {shown} in the catalog",
                            f"counts offered: {', '.join(f'{c:g}' for c in counts)}")
    return kept


async def _follow(call: Call, request: RunningRequest) -> dict[str, Any]:
    await call.emit("request", {"request_id": request.id, "op": request.op,
                                "cluster": request.cluster})
    async for name, data in request.follow():
        await call.emit(name, data)
    return {**request.outcome(), "request_id": request.id}


def _ended(record: RequestRecord) -> dict[str, Any]:
    """The outcome of a request that is over, from its record: its result, or its error."""
    if record.status == RequestState.SUCCEEDED:
        return {**(record.result or {}), "request_id": record.id}
    # Requests left RUNNING by a daemon that died are marked INTERRUPTED on the next start.
    code = record.error_code or ErrorCode.SHUTTING_DOWN
    raise ProtocolError(ErrorCode(code) if code in ErrorCode.__members__ else ErrorCode.INTERNAL,
                        record.error_message or f"request {record.id} ended {record.status}",
                        f"request {record.id} ({record.op}) is over: {record.status}")


async def _load(args: protocol.TaskArgs) -> TaskSpec:
    """The task, read and parsed in a thread when it is YAML: a big (or hostile) file must
    not hold up the event loop. (The reading never blocks: see safe_yaml.)"""
    check_range("num_nodes", args.num_nodes, 1, MAX_NUM_NODES)

    def load() -> TaskSpec:
        return load_task(
            yaml_path=args.yaml_path,
            yaml_text=args.yaml_text,
            command=args.command,
            source=args.source,
            cwd=args.cwd,
            env_overrides=args.envs,
            secret_overrides=args.secrets,
        )

    task = load() if args.command is not None else await anyio.to_thread.run_sync(load)
    if args.strict and task.warnings:
        raise ProtocolError(ErrorCode.INVALID_TASK, f"{task.source}: {task.warnings[0]}",
                            fields.STRICT_HINT)
    return apply_overrides(task, num_nodes=args.num_nodes, name=args.name, cpus=args.cpus,
                           **_run_overrides(args))


def _run_overrides(args: protocol.TaskArgs) -> dict[str, Any]:
    """What `launch` and `exec` (RunArgs) add to every task's overrides."""
    if not isinstance(args, protocol.RunArgs):
        return {}
    return {"resources": {name: getattr(args, name) for name in RESOURCE_OVERRIDES
                          if name != "cpus"},
            "workdir": args.workdir, "cwd": args.cwd, "no_setup": args.no_setup}


def _launch_request(name: str, args: protocol.LaunchArgs, task: TaskSpec) -> LaunchRequest:
    """The wire's launch, typed for the service (the edge where LaunchArgs stops)."""
    return LaunchRequest(name, task, infra=Infra.parse(args.infra) if args.infra else None,
                         autostop=autostop_for(args.idle_minutes, args.down, task),
                         retry_until_up=args.retry_until_up, strict=args.strict)
