"""The managed-jobs controller: one driver per unfinished job, in the daemon's task group.

A driver moves its job PENDING -> STARTING -> RUNNING -> (RECOVERING -> RUNNING)* -> a final
status. Everything it does goes through the services a user's own commands use (a launch
with full failover, a submission to the agent, a teardown), as daemon-owned requests, so
`requests`, events and locks show them.

Crash safety: the job's one cluster name is fixed when the job is recorded, every decision
is written before it is acted on (the final status to take is recorded as `ending` before
the teardown), and a restarted daemon starts a driver for every unfinished record, which
looks at what exists (the cluster record, the agent's job) and goes on from there. Since the
name never changes, a job can never own two clusters.

The job's log is copied, as it streams, into one local file per job (so it outlives the
clusters); each attempt starts with a marker line. The daemon's own log lines about the job
(everything its driver does) are teed into another (`joblog`), for `jobs logs --controller`.
The stream is also the fastest sign of the job's end; a poll of the provider's node states,
the daemon's own SSH connections to the nodes and the agent's health (every few seconds, and
at once when the stream breaks) is the sign of a cluster lost under it.

The drivers run on the controller engine (clusterd.control): the controller is its
`Controller` for managed jobs, whose decisions are the pure functions of steps.py.
"""

from __future__ import annotations

import dataclasses
import functools
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
import structlog

from clusterctl import protocol
from clusterctl.protocol import ClusterStatus, ErrorCode, JobStatus, ProtocolError
from clusterctl.protocol import ManagedJobStatus as S
from clusterd import log
from clusterd.control import (
    Action,
    Controller,
    Engine,
    NodeLinks,
    RestartPacer,
    RetryGaps,
    is_throttling,
)
from clusterd.managed.joblog import JobLogFiles
from clusterd.managed.logstream import Emit, JobLogStreams
from clusterd.managed.poll import HealthPoll, cluster_health
from clusterd.managed.recovery import RecoveryPolicy, policy_from_yaml
from clusterd.managed.steps import (
    USER_FAILURES,
    Finish,
    Launch,
    Recover,
    Restart,
    Submit,
    Watch,
    after_attempt,
    next_action,
)
from clusterd.managed.store import (
    ManagedJobRecord,
    ManagedJobStore,
    SubmittedTask,
    owner_tag,
)
from clusterd.providers.registry import ProviderRegistry
from clusterd.provision.plan import LaunchRequest, autostop_for
from clusterd.redact import redact_urls
from clusterd.requests import RequestManager, RunningRequest, current_request
from clusterd.runtime.agent_access import AgentAccess
from clusterd.services.clusters import ClusterService, brief
from clusterd.services.jobs import JobService
from clusterd.state.clusters import ClusterRecord, ClusterStore
from clusterd.tasks.loader import load_task
from clusterd.tasks.overrides import apply_overrides
from clusterd.tasks.spec import Infra, TaskSpec

logger = log.get("clusterd.managed")

# Errors of a launch that no retry can mend: the task itself is wrong for every place, or
# the job's cluster name is a cluster it did not make (see refuse_other_owner).
PRECHECK_CODES = frozenset({ErrorCode.INVALID_TASK, ErrorCode.INVALID_ARGUMENT,
                            ErrorCode.UNSUPPORTED, ErrorCode.INVALID_NAME,
                            ErrorCode.MANAGED_CLUSTER})
# Consecutive failed agent health checks after which the cluster counts as lost.
AGENT_STRIKES = 3
# Times in a row the job's log stream may fail to be followed again (one poll apart) before
# the attempt counts as lost whatever the health checks say: they decide first, as a row of
# this length outlasts AGENT_STRIKES polls.
STREAM_TRIES = 5
# Launch failures other than capacity after which a job that has not run yet fails.
FIRST_LAUNCH_TRIES = 3


@dataclasses.dataclass(frozen=True)
class Timing:
    # Provider and agent health checks while RUNNING (at once when the job's log stream
    # breaks: see HealthPoll).
    poll_s: float = 3.0
    retry_gap_s: float = 10.0  # between relaunch rounds with no capacity (grows, capped)
    retry_max_gap_s: float = 120.0
    step_timeout_s: float = 1800.0  # a launch, submission or teardown, at most


class ManagedJobController(Controller[int, ManagedJobRecord, ClusterRecord | None]):
    def __init__(self, store: ManagedJobStore, cluster_store: ClusterStore,
                 clusters: ClusterService, jobs: JobService, providers: ProviderRegistry,
                 access: AgentAccess, requests: RequestManager, log_dir: Path,
                 timing: Timing = Timing(), *, links: NodeLinks | None = None,
                 pacer: RestartPacer | None = None) -> None:
        self._store = store
        self._cluster_store = cluster_store
        self._clusters = clusters
        self._jobs = jobs
        self._providers = providers
        self._access = access
        self._requests = requests
        self._log_dir = log_dir
        self._files = JobLogFiles(log_dir)
        self._timing = timing
        self._links = links
        self._engine: Engine[int, ManagedJobRecord, ClusterRecord | None] = Engine(
            self, "managed-job", pacer)
        self._changed: dict[int, anyio.Event] = {}
        # Secret values live here only (never on disk): a relaunch after a daemon restart
        # cannot have them, and says so (see _task).
        self._secrets: dict[int, dict[str, str]] = {}
        self._tasks: dict[int, TaskSpec] = {}
        # Cluster -> the launch a driver started for it, while it runs (see _end).
        self._launches: dict[str, RunningRequest] = {}
        self._streams = JobLogStreams(store, self._files, self.require, self._change_of)

    # -- the service --------------------------------------------------------------------

    async def run(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
                  ) -> None:
        self._log_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        log.tee("managed_job", self._tee)
        try:
            await self._engine.run([r.id for r in self._store.active()],
                                   task_status=task_status)
        finally:
            log.tee("managed_job", None)

    def _tee(self, job_id: Any, line: str) -> None:
        """A daemon log line bound to `managed_job`: kept with that job (if it is one)."""
        if isinstance(job_id, int) and self._store.get(job_id) is not None:
            self._files.append_controller_line(job_id, line)

    def _spawn(self, job_id: int) -> None:
        if not self._engine.spawn(job_id):
            raise ProtocolError(ErrorCode.SHUTTING_DOWN, "the managed-jobs controller is not "
                                "running", "retry in a moment")

    async def submit(self, task: TaskSpec, submitted: SubmittedTask) -> ManagedJobRecord:
        name = redact_urls(task.name or (submitted.command or "job").split()[0])
        # A cluster of the user's named as the job's would be is never shared: the job's
        # name gets a suffix.
        record = await self._store.insert(name, submitted, "sky-managed",
                                          taken=lambda n: self._cluster_store.get(n) is not None)
        self._secrets[record.id] = dict(task.secrets)
        self._tasks[record.id] = task
        self._files.create(record.id)
        logger.info("managed job submitted", managed_job=record.id, cluster=record.cluster)
        self._spawn(record.id)
        return record

    async def cancel(self, job_ids: list[int], cancel_all: bool) -> dict[str, Any]:
        targets = self._store.active() if cancel_all else [self.require(i) for i in job_ids]
        cancelled, already = [], []
        for record in targets:
            if record.status.is_final or record.ending is not None:
                already.append(record.id)  # ended, or ending (its teardown under way)
                continue
            if record.status != S.CANCELLING:
                await self._store.set_status(record.id, S.CANCELLING, "cancel requested")
            cancelled.append(record.id)
            self._poke(record.id)
            # The driver tears the cluster down, then ends CANCELLED.
            if not self._engine.cancel(record.id):
                self._spawn(record.id)
        return {"cancelled": cancelled, "already_finished": already}

    def require(self, job_id: int) -> ManagedJobRecord:
        record = self._store.get(job_id)
        if record is None:
            raise ProtocolError(ErrorCode.MANAGED_JOB_NOT_FOUND,
                                f"there is no managed job {job_id}",
                                "see `clusterctl jobs queue --all`")
        return record

    def view(self, record: ManagedJobRecord) -> dict[str, Any]:
        now = time.time()
        placed = record.placed
        return {
            "job_id": record.id, "name": record.name, "status": str(record.status),
            "status_reason": record.status_reason, "cluster": record.cluster,
            "task_id": record.task_id, "submitted_at": record.submitted_at,
            "started_at": record.started_at, "ended_at": record.ended_at,
            "total_seconds": round((record.ended_at or now) - record.submitted_at, 1),
            "job_seconds": round(record.job_seconds(now), 1),
            "attempts": record.attempts, "recoveries": record.recoveries,
            "user_restarts": record.user_restarts,
            "infra": placed.infra if placed is not None else None,
            # Asked for, then what it got once placed: "1x[CPU:2, spot] m6i.large".
            "resources": " ".join(p for p in (record.task.resources,
                                              placed and placed.instance_type) if p) or None,
        }

    def queue(self, include_finished: bool) -> dict[str, Any]:
        records = self._store.all() if include_finished else self._store.active()
        return {"jobs": [self.view(r) for r in reversed(records)]}

    # -- the log ------------------------------------------------------------------------

    def _append(self, job_id: int, data: bytes) -> None:
        self._files.append(job_id, data)
        self._poke(job_id)

    def _change_of(self, job_id: int) -> anyio.Event:
        return self._changed.setdefault(job_id, anyio.Event())

    def _poke(self, job_id: int) -> None:
        event = self._changed.pop(job_id, None)
        if event is not None:
            event.set()

    async def stream_log(self, job_id: int, follow: bool, emit: Emit, tail: int = 0
                         ) -> dict[str, Any]:
        """The job's local log as `log` events (its last `tail` lines only, if > 0); with
        `follow`, until the job ends."""
        return await self._streams.output(job_id, follow, tail, emit)

    async def stream_controller_log(self, job_id: int, follow: bool, emit: Emit,
                                    tail: int = 0) -> dict[str, Any]:
        """The job's events and the daemon's lines about it, by time; with `follow`, until
        the job ends."""
        return await self._streams.controller(job_id, follow, tail, emit)

    # -- the driver (the engine's Controller) ----------------------------------------------

    def enter(self, key: int) -> None:
        # Not the submitting call's work (its log lines, its request's progress).
        structlog.contextvars.clear_contextvars()
        structlog.contextvars.bind_contextvars(managed_job=key)
        current_request.set(None)

    def intent(self, key: int) -> ManagedJobRecord | None:
        record = self.require(key)
        return None if record.status.is_final else record

    async def observe(self, intent: ManagedJobRecord) -> ClusterRecord | None:
        return self._cluster_store.get(intent.cluster)

    def step(self, intent: ManagedJobRecord, observed: ClusterRecord | None
             ) -> Action | None:
        return next_action(intent, observed)

    async def act(self, intent: ManagedJobRecord, action: Action) -> None:
        match action:
            case Finish(status, reason):
                await self._end(intent.id, status, reason)
            case Recover(why):
                await self._lost(intent, why)
            case Launch():
                await self._launch(intent)
            case Submit():
                await self._submit(intent)
            case Watch():
                await self._watch(intent)
            case Restart(restarts, reason):
                await self._store.set_status(intent.id, S.RECOVERING, reason,
                                             user_restarts=restarts, agent_job_id=None)
            case _:
                raise TypeError(f"not a managed job's action: {action!r}")

    async def failed(self, key: int, error: Exception) -> None:
        logger.error("managed job driver failed", managed_job=key, exc_info=error)
        await self._end(key, S.FAILED_CONTROLLER,
                        f"controller error: {type(error).__name__}: {brief(str(error))}")

    async def settle(self, key: int) -> None:
        if self.require(key).status == S.CANCELLING:
            await self._end(key, S.CANCELLED, "cancelled by the user")

    def released(self, key: int) -> None:
        self._poke(key)

    async def _task(self, record: ManagedJobRecord) -> TaskSpec | None:
        """The job's task with its secrets and URL credentials; None (and the job ended) if a
        restart lost them."""
        task = self._tasks.get(record.id)
        if task is not None:
            return task
        sub = record.task
        # Never run with `<redacted>` where a secret or a URL's credentials were.
        kept_in_memory = ([f"its secrets ({', '.join(sub.secret_names)})"] if sub.secret_names
                          else []) + ([f"the credentials in its URLs ({', '.join(sub.redacted)})"]
                                      if sub.redacted else [])
        if kept_in_memory and record.id not in self._secrets:
            await self._end(record.id, S.FAILED_CONTROLLER,
                            f"the job needs its task again, and {', '.join(kept_in_memory)} "
                            "are kept only in memory: a daemon restart lost them; submit the "
                            "job again")
            return None

        def load() -> TaskSpec:
            return load_task(yaml_text=sub.yaml_text, command=sub.command, source=sub.source,
                             cwd=sub.cwd, env_overrides=sub.envs)

        task = apply_overrides(await anyio.to_thread.run_sync(load), num_nodes=sub.num_nodes,
                               name=sub.name, cpus=sub.cpus)
        task = dataclasses.replace(task, secrets=self._secrets.get(record.id, {}))
        self._tasks[record.id] = task
        return task

    def _gaps(self) -> RetryGaps:
        return RetryGaps(self._timing.retry_gap_s, self._timing.retry_max_gap_s)

    def _policy(self, record: ManagedJobRecord) -> RecoveryPolicy:
        return policy_from_yaml(record.task.yaml_text, record.task.source)

    async def _request(self, op: str, cluster: str, args: dict[str, Any],
                       work: Callable[[RunningRequest], Awaitable[dict[str, Any]]]
                       ) -> dict[str, Any]:
        """Run `work` as a daemon-owned request (shown by `requests`) and wait for it."""
        request = await self._requests.start(op, cluster, {**args, "by": "managed job"}, work)
        if op == "launch":
            self._launches[cluster] = request
        with anyio.fail_after(self._timing.step_timeout_s):
            await request.done.wait()
        # Kept only if this wait was cancelled before the launch ended.
        self._launches.pop(cluster, None)
        return request.outcome()

    async def _launch(self, record: ManagedJobRecord) -> bool:
        """A cluster for the job, UP; False if the job ended instead."""
        recovering = record.status in (S.RUNNING, S.RECOVERING)
        if self._cluster_store.get(record.cluster) is not None:
            # Left by an interrupted launch, or lost under the job: nothing of it is reused.
            await self._down(record, "its cluster is not UP; tearing down what is left")
        task = await self._task(record)
        if task is None:
            return False
        if record.status == S.PENDING:
            record = await self._store.set_status(record.id, S.STARTING, "launching a cluster")
        gaps = self._gaps()
        failures = 0
        # The first relaunch round avoids where the job was just lost, as its strategy says
        # (recovery.py); if that finds nothing, the next tries everywhere.
        steering = self._policy(record).steering(record.placed) if recovering else None
        name = record.cluster
        infra = record.task.infra
        # What `clusterctl requests` shows of it: the launch a user would have asked for.
        shown = protocol.to_wire(protocol.LaunchArgs(cluster=name, infra=infra))
        launch_task = dataclasses.replace(task, run=None, setup=None)
        while True:
            if steering is not None:
                await self._store.add_event(record.id, f"relaunching: {steering.describe()}")
            try:
                launch = LaunchRequest(name, launch_task, Infra.parse(infra) if infra else None,
                                       autostop=autostop_for(None, False, launch_task),
                                       steering=steering, owner=owner_tag(record.id))
                await self._request("launch", name, shown,
                                    functools.partial(self._clusters.launch, launch=launch))
            except ProtocolError as exc:
                reason = f"launch failed: {brief(exc.message)}"
                if exc.code in PRECHECK_CODES:
                    await self._end(record.id, S.FAILED_PRECHECKS, reason)
                    return False
                if steering is not None and exc.code == ErrorCode.RESOURCES_UNAVAILABLE:
                    await self._store.add_event(
                        record.id, f"{reason}; trying everywhere, where it was lost too")
                    steering = None
                    continue
                # Throttled everywhere is no lack of capacity: the job waits it out.
                throttled = is_throttling(exc)
                if (not recovering and exc.code == ErrorCode.RESOURCES_UNAVAILABLE
                        and not throttled):
                    await self._end(record.id, S.FAILED_NO_RESOURCE, reason)
                    return False
                failures += 1
                if not recovering and failures >= FIRST_LAUNCH_TRIES:
                    # A job that never ran fails as a launch would (bad credentials, an
                    # API that keeps refusing); one that ran keeps trying (below).
                    await self._end(record.id, S.FAILED_PRECHECKS,
                                    f"{reason} (the first launch failed {failures} times)")
                    return False
                # Never given up silently: the job waits, showing why, until capacity comes
                # back or it is cancelled.
                record = self.require(record.id)
                gap = gaps.next(throttled)
                text = f"{reason}; trying again in {gap:.0f} s"
                await self._store.update(record.id, status_reason=text)
                await self._store.add_event(record.id, text)
                await anyio.sleep(gap)
                if self._cluster_store.get(record.cluster) is not None:
                    await self._down(record, "removing what the failed launch left")
                continue
            cluster = self._cluster_store.get(record.cluster)
            await self._store.update(
                record.id, placed=cluster.launched_resources if cluster else None)
            return True

    async def _submit(self, record: ManagedJobRecord) -> None:
        """Submit the next attempt to the job's UP cluster. Whatever an earlier attempt left
        queued there (a submission whose reply a killed daemon never recorded) is cancelled
        first: the cluster is the job's own, so only its attempts run there."""
        task = await self._task(record)
        if task is None:
            return
        try:
            await self._jobs.cancel(record.cluster, [], True)
        except ProtocolError as exc:
            await self._lost(record, f"the agent does not answer: {brief(exc.message)}")
            return
        attempt = record.attempts + 1
        head = f"=== managed job {record.id}: attempt {attempt} on {record.cluster} ("
        marker = (f"\n{head}{time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())} UTC) ===\n")
        if record.attempts == 0:
            marker = marker.lstrip("\n")
        # A submission of this attempt that never got recorded (a daemon killed during it,
        # an agent that did not answer) left its marker last in the log: one is enough.
        if not self._files.last_line(record.id).startswith(head):
            self._append(record.id, marker.encode())
        base = self._files.size(record.id)
        envs = {**task.envs, "SKYPILOT_MANAGED_JOB_ID": str(record.id),
                "SKYPILOT_MANAGED_JOB_ATTEMPT": str(attempt)}
        job_task = dataclasses.replace(task, envs=envs)
        try:
            result = await self._request(
                "exec", record.cluster, {"cluster": record.cluster, "managed_job": record.id},
                lambda r: self._jobs.exec(r, record.cluster, job_task, run_setup=True,
                                          task_id=record.task_id))
        except ProtocolError as exc:
            if exc.code in PRECHECK_CODES or exc.code == ErrorCode.CLUSTER_MISMATCH:
                await self._end(record.id, S.FAILED_PRECHECKS,
                                f"submission refused: {brief(exc.message)}")
                return
            await self._lost(record, f"submission failed: {brief(exc.message)}")
            return
        await self._store.set_status(
            record.id, S.RUNNING, f"attempt {attempt} running on {record.cluster}",
            agent_job_id=int(result["job_id"]), log_base=base, attempts=attempt)

    async def _watch(self, record: ManagedJobRecord) -> None:
        """Follow the attempt until it ends or its cluster is lost; act on which it was."""
        assert record.agent_job_id is not None
        found: dict[str, Any] = {}
        # The stream breaking (a preempted node's connection drops at once) makes the health
        # check look now rather than at its next poll.
        poll = HealthPoll(self._timing.poll_s)

        async def emit(name: str, data: dict[str, Any]) -> None:
            if name == "log":
                self._append(record.id, data["data"])

        async with anyio.create_task_group() as group:
            async def stream() -> None:
                for tries in range(1, STREAM_TRIES + 1):
                    offset = self._files.size(record.id) - record.log_base
                    try:
                        found["end"] = await self._jobs.stream_logs(
                            record.cluster, record.agent_job_id, follow=True, tail=0,
                            offset=max(0, offset), emit=emit, on_break=poll.look_now)
                        break
                    except ProtocolError as exc:
                        why = f"the job's log stream broke: {brief(exc.message)}"
                        if exc.code == ErrorCode.JOB_NOT_FOUND or tries == STREAM_TRIES:
                            found.setdefault("lost", why)
                            break
                        # Whether the cluster is lost is the health checks' to say: a head
                        # slow to take an SSH connection (a daemon just started on a loaded
                        # machine) is not. They look now; the stream goes on from where it
                        # stopped.
                        logger.info("the job's log stream broke; following it again",
                                    managed_job=record.id, error=exc.message)
                        poll.look_now()
                        await anyio.sleep(self._timing.poll_s)
                group.cancel_scope.cancel()

            async def health() -> None:
                strikes = 0
                noted = ""  # the INIT cluster's reason last said
                while True:
                    early = await poll.wait()
                    cluster = self._cluster_store.get(record.cluster)
                    if cluster is not None and cluster.status == ClusterStatus.INIT \
                            and cluster.status_reason != noted:
                        noted = cluster.status_reason
                        logger.info("the job's cluster is INIT: checking it before counting it "
                                    "lost", reason=noted)
                    why, agent_ok = await self._health(record)
                    # Strikes count at the poll's pace only: an agent that restarts is not
                    # given up on sooner because the stream noticed it first.
                    if agent_ok:
                        strikes = 0
                    elif not early:
                        strikes += 1
                    if why is None and strikes >= AGENT_STRIKES:
                        why = f"its agent did not answer {strikes} checks in a row"
                    if why is not None:
                        found["lost"] = why
                        group.cancel_scope.cancel()
                        return

            group.start_soon(stream)
            group.start_soon(health)
        if "lost" in found:
            await self._lost(record, found["lost"])
            return
        if "end" not in found:  # a bug (see agent_client.closed_under_the_call): named
            raise RuntimeError("the job's log stream stopped with neither a status nor an "
                               "error")
        end = found["end"]
        status = JobStatus(end["status"])
        # Only a user failure needs the cluster asked (see after_attempt).
        lost = (await self._health(record))[0] if status in USER_FAILURES else None
        await self.act(record, after_attempt(record, status, end.get("failure_reason") or "",
                                             lost, self._policy(record)))

    async def _health(self, record: ManagedJobRecord) -> tuple[str | None, bool]:
        """(why the cluster counts as lost, or None; whether its agent answered)."""
        return await cluster_health(self._cluster_store.get(record.cluster), self._providers,
                                    self._access, self._links)

    async def _lost(self, record: ManagedJobRecord, why: str) -> None:
        """The cluster is lost: torn down; the next step relaunches it.

        A recovery is an attempt ended by its cluster's loss, so only a loss under a running
        attempt (one the record holds) is counted, marked in the log and makes the job
        RECOVERING. A loss with no attempt running (the cluster of a daemon killed in the
        teardown of a loss already counted, whose record still said UP; or lost before a
        submission) ends no attempt: it is an event, and the job keeps its status. So
        attempts == 1 + recoveries + user_restarts for every job that ran."""
        record = self.require(record.id)
        if record.status in (S.CANCELLING,) or record.status.is_final:
            return
        text = f"cluster {record.cluster} lost: {why}"
        logger.warning("managed job's cluster lost", managed_job=record.id, why=why,
                       attempt_running=record.agent_job_id is not None)
        if record.agent_job_id is None:
            await self._store.add_event(record.id, f"{text} (no attempt was running on it); "
                                        "relaunching")
        else:
            self._append(record.id, f"\n=== managed job {record.id}: {text}; recovering ===\n"
                         .encode())
            await self._store.set_status(record.id, S.RECOVERING, text, agent_job_id=None,
                                         recoveries=record.recoveries + 1)
        await self._down(record, "recovering: tearing down what is left of the lost cluster",
                         discard=True)

    async def _down(self, record: ManagedJobRecord, why: str, discard: bool = False) -> None:
        """Tear the job's cluster down, trying until it is gone. After a few failures the
        teardown is forced (`--purge`: cleanup failures become warnings). A lost cluster is
        discarded: cloud nodes are terminated without being reached first. Only a cluster
        the job made is torn down: one of that name made by anyone else is left alone."""
        gaps = self._gaps()
        failures = 0
        while (cluster := self._cluster_store.get(record.cluster)) is not None \
                and cluster.owner == owner_tag(record.id):
            purge = failures >= 3
            try:
                await self._request(
                    "down", record.cluster, {"cluster": record.cluster, "purge": purge},
                    functools.partial(self._clusters.down, name=record.cluster, purge=purge,
                                      reason=why, call_off=True, discard=discard))
            except ProtocolError as exc:
                failures += 1
                gap = gaps.next(is_throttling(exc))
                text = f"teardown of {record.cluster} failed: {brief(exc.message)}"
                await self._store.add_event(record.id, f"{text}; trying again in {gap:.0f} s")
                await anyio.sleep(gap)

    async def _end(self, job_id: int, status: S, reason: str) -> None:
        """The job ends: its final status is recorded as `ending` first, then the cluster
        is torn down, and only then is the status set; a daemon killed in between finishes
        the teardown on restart. A job being cancelled ends CANCELLED whatever ended it."""
        record = self.require(job_id)
        if record.status.is_final:
            return
        if status == S.FAILED_PRECHECKS and record.status not in (S.PENDING, S.STARTING):
            status = S.FAILED_CONTROLLER  # a job that ran passed its prechecks
        if record.ending is None:
            fields: dict[str, Any] = {"ending": f"{status} {reason}"}
            if record.run_started_at is not None:
                # The run is over: the teardown that follows is not the job's running time.
                fields.update(run_seconds=record.job_seconds(), run_started_at=None)
            record = await self._store.update(job_id, **fields)
        why = f"managed job {job_id} ended: {status}"
        await self._down(record, why)
        # A launch the driver left (cancelled while it waited for it) may not have recorded
        # its cluster yet when the teardown looked: let it finish or fail, then look again.
        launch = self._launches.pop(record.cluster, None)
        if launch is not None and not launch.done.is_set():
            with anyio.move_on_after(self._timing.step_timeout_s):
                await launch.done.wait()
            await self._down(record, why)
        # Buckets made for the job outlive its clusters (a recovered job finds its
        # checkpoints): only now do `persistent: false` ones go.
        await self._request("release", record.cluster, {"owner": owner_tag(job_id)},
                            functools.partial(self._clusters.release_buckets,
                                              name=owner_tag(job_id)))
        if self.require(job_id).status == S.CANCELLING:
            status = S.CANCELLED
        await self._store.set_status(job_id, status, reason)
        self._tasks.pop(job_id, None)
        self._secrets.pop(job_id, None)
        logger.info("managed job ended", managed_job=job_id, status=str(status))
