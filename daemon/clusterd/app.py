"""The daemon: builds the services once, then runs everything in one root task group.

Background work (requests, connections) lives in that group and nothing outlives it. SIGTERM
stops accepting connections, gives in-flight requests a bounded grace period, closes agent
connections and the database, and returns.
"""

from __future__ import annotations

import contextlib
import dataclasses
import fcntl
import os
import secrets
import signal
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import IO

import anyio
import anyio.abc

from clusterctl import _state_owner
from clusterctl._state_owner import StateOwner
from clusterctl._version import __version__
from clusterctl.protocol import Notice, ProtocolError
from clusterd import log
from clusterd.concurrency import survive
from clusterd.config import Settings
from clusterd.control import NodeLinks
from clusterd.control.restart import RestartPacer
from clusterd.cost.budget import Budget, SpendMeter
from clusterd.cost.budget_actions import RequestActions
from clusterd.cost.budget_controller import BudgetController
from clusterd.cost.budget_store import BudgetStore
from clusterd.cost.idle_guard import IdleGuard
from clusterd.cost.ledger import Ledger
from clusterd.cost.prices import Prices
from clusterd.heap import Heap
from clusterd.keptlogs.keeper import LogKeeper
from clusterd.keptlogs.store import Caps, KeptLogStore
from clusterd.locks import ClusterLocks
from clusterd.loop_watch import LoopWatch
from clusterd.managed.controller import ManagedJobController, Timing
from clusterd.managed.store import ManagedJobStore
from clusterd.nodes import NodeInfo, SSHTarget
from clusterd.providers.aws.provider import AWSProvider
from clusterd.providers.base import ProviderContext, ProviderHandle
from clusterd.providers.offered import build_providers
from clusterd.providers.ssh_pools import load_pools
from clusterd.provision.launcher import Provisioner
from clusterd.requests import RequestManager, current_request
from clusterd.runtime.agent_access import AgentAccess
from clusterd.runtime.agent_client import AgentConnections
from clusterd.runtime.install import CURRENT_PYTHON, WheelhouseBuilder
from clusterd.runtime.manager import RuntimeManager
from clusterd.runtime.node_platform import PythonSource
from clusterd.runtime.runner import CommandRunner, LocalRunner
from clusterd.server.connection import Connection
from clusterd.server.handlers import Handlers
from clusterd.server.listener import (
    connection_cap,
    open_listener,
    prepare_directory,
    raise_open_files_limit,
    remove_socket,
    serve_connections,
)
from clusterd.server.stream import BufferedSocketStream
from clusterd.services.autostop import AutostopService
from clusterd.services.clusters import ClusterService
from clusterd.services.cost import CostService
from clusterd.services.jobs import JobService
from clusterd.services.node_runtime import NodeRuntime
from clusterd.services.orphans import OrphanWatch
from clusterd.services.refresh import RefreshService
from clusterd.services.usage import UsageService
from clusterd.ssh.config_files import SSHConfigWriter
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from clusterd.ssh.runner import SSHRunner
from clusterd.ssh.tunnels import TunnelManager, TunnelState
from clusterd.state.clusters import ClusterStore
from clusterd.state.db import Database
from clusterd.state.requests import RequestStore
from clusterd.storage.cluster_mounts import ClusterMounts
from clusterd.storage.node_rclone import NodeRclone
from clusterd.storage.registry import BucketRegistry
from clusterd.storage.s3 import S3Buckets
from clusterd.storage.service import StorageService
from clusterd.tasks.file_sync import CopyGuard
from clusterd.user_config import ConfigFile

logger = log.get("clusterd")


class AlreadyRunning(RuntimeError):
    pass


class StateInUse(AlreadyRunning):
    """Another clusterd serves this state directory (see clusterctl._state_owner)."""

    def __init__(self, state_dir: Path, owner: StateOwner | None) -> None:
        self.state_dir = state_dir
        self.owner = owner
        holder = (f"pid {owner.pid}, on socket {owner.socket}" if owner
                  else "its pid not yet written")
        super().__init__(f"another clusterd ({holder}) serves the state in {state_dir}")


@contextlib.contextmanager
def single_instance(lock_path: Path) -> Iterator[IO[str]]:
    """Hold an exclusive lock for the daemon's lifetime: one clusterd per socket."""
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    handle = open(lock_path, "a+")  # noqa: SIM115 - held until the context ends
    try:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            handle.seek(0)
            holder = handle.read().strip() or "?"
            raise AlreadyRunning(f"another clusterd (pid {holder}) holds {lock_path}") from None
        handle.seek(0)
        handle.truncate()
        handle.write(str(os.getpid()))
        handle.flush()
        yield handle
    finally:
        handle.close()


@contextlib.contextmanager
def state_owner(state_dir: Path, socket_path: Path) -> Iterator[None]:
    """Hold the state directory for the daemon's lifetime: one clusterd per state, whatever
    its socket. Taken before anything reads or writes the state; the kernel lets go of it
    when the process dies, however it dies."""
    fd = os.open(_state_owner.lock_path(str(state_dir)),
                 os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise StateInUse(state_dir, _holder(fd)) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, _state_owner.encode(StateOwner(os.getpid(), str(socket_path))), 0)
        yield
    finally:
        os.close(fd)


def _holder(fd: int) -> StateOwner | None:
    """Who holds the state lock, as it wrote down; it writes just after it takes the lock,
    so a start racing ours may need a moment."""
    for _ in range(50):
        owner = _state_owner.decode(os.pread(fd, 4096, 0))
        if owner is not None:
            return owner
        time.sleep(0.01)
    return None


def daemon_id(state_dir: Path) -> str:
    """This daemon's identity, made once per state directory: what it creates in a cloud is
    tagged with it, so it can tell its own instances (and orphans of its records) apart.
    Made with link(2), which fails if the name exists: of two daemons starting at once on a
    new state directory, both read the one identity that was written first."""
    path = state_dir / "daemon-id"
    try:
        return path.read_text().strip()
    except FileNotFoundError:
        pass
    state_dir.mkdir(parents=True, exist_ok=True)
    ident = f"clusterd-{secrets.token_hex(6)}"
    tmp = state_dir / f"daemon-id.{secrets.token_hex(4)}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(ident + "\n")
    try:
        os.link(tmp, path)
    except FileExistsError:
        return path.read_text().strip()
    finally:
        tmp.unlink()
    return ident


def storage_service(aws: object, db: Database,
                    runner_for: Callable[[NodeInfo], CommandRunner],
                    daemon: str, wheelhouse_dir: Path) -> StorageService:
    """Buckets go through the aws provider's session (its credentials, region, endpoints)."""
    assert isinstance(aws, AWSProvider)
    store = aws.object_store()
    return StorageService(S3Buckets(store.s3_client, store.default_region), BucketRegistry(db),
                          runner_for, store.credentials, store.default_region, daemon,
                          NodeRclone(wheelhouse_dir), ClusterMounts(db),
                          lifetime=store.lifetime)


class Daemon:
    def __init__(self, settings: Settings) -> None:
        self.settings = settings
        self.db = Database(settings.db_path)
        self.store = ClusterStore(self.db)
        self.request_store = RequestStore(self.db)
        self.requests = RequestManager(self.request_store)
        self.locks = ClusterLocks(settings.lock_timeout_s, settings.blocked_notice_s)
        self.host_keys = HostKeyStore(settings.state_dir / "known_hosts")
        self.ssh = SSHConnections(self.host_keys, on_new_host_key=self._announce_host_key)
        self.access = AgentAccess(
            AgentConnections(), TunnelManager(self.ssh, settings.runtime_dir / "tunnels"),
            on_tunnel=self._record_tunnel,
        )
        self.config = ConfigFile()
        self.providers = build_providers(
            ProviderContext(settings.state_dir, settings.runtime_dir, settings.config_dir,
                            self.ssh, self.config.get, daemon_id(settings.state_dir),
                            self._recorded, settings, on_foreign=self._announce_foreign,
                            on_progress=self._tell_request,
                            on_note=self._provider_note),
            # Benchmarks only (see providers/loadtest.py).
            test_providers=settings.test_providers.split(","))
        self.runtime = RuntimeManager(
            self.runner_for,
            self.access,
            WheelhouseBuilder(settings.wheelhouse_dir,
                              PythonSource(settings.python_mirror,
                                           settings.python_downloads_json_url)),
            settings.runtime_dir / "agents",
            settings.local_object_store_bytes,
            settings.runtime_start_timeout_s,
            settings.agent_autostop_grace_s,
            max(1, settings.agent_job_retention),
        )
        self.storage = storage_service(self.providers.get("aws"), self.db, self.runner_for,
                                       daemon_id(settings.state_dir), settings.wheelhouse_dir)
        self.started_at = time.time()  # buckets whose create began before are a past run's
        self.keeper = LogKeeper(
            self.store, self.access,
            KeptLogStore(settings.state_dir / "kept-logs",
                         Caps(settings.kept_log_job_bytes, settings.kept_log_cluster_bytes,
                              settings.kept_history)),
            settings.kept_log_interval_s, settings.kept_log_last_round_s)
        self.jobs = JobService(self.store, self.locks, self.providers, self.access,
                               self.runner_for,
                               CopyGuard(settings.never_copied, settings.sync_warn_bytes),
                               self.storage, self.keeper)
        self.provisioner = Provisioner(
            self.store, self.providers, wait_timeout_s=settings.provision_wait_s,
            retry_gap_s=settings.retry_gap_s, retry_max_gap_s=settings.retry_max_gap_s)
        self.clusters = ClusterService(
            self.store, self.locks, self.providers, NodeRuntime(self.runtime, self.access),
            self.jobs,
            SSHConfigWriter(settings.config_dir / "ssh", self.host_keys.path), self.provisioner,
            forget_nodes=self.ssh.forget, storage=self.storage,
            keep_logs=self.keeper.before_teardown,
            ledger=Ledger(self.db, Prices(self.config.get, lambda: load_pools(
                settings.config_dir / "ssh_node_pools.yaml"))),
        )
        self.orphans = OrphanWatch(self.store, self.providers)
        self.refresh = RefreshService(
            self.store, self.locks, self.providers, self.runtime, self.access, self.clusters,
            self.requests, settings.refresh_interval_s, self.orphans,
        )
        self.autostop = AutostopService(
            self.store, self.locks, self.providers, self.access, self.clusters, self.requests,
            settings.autostop_check_s,
        )
        self.managed_store = ManagedJobStore(self.db)
        self.managed = ManagedJobController(
            self.managed_store, self.store, self.clusters, self.jobs, self.providers,
            self.access, self.requests, settings.state_dir / "managed-jobs",
            Timing(retry_gap_s=settings.retry_gap_s, retry_max_gap_s=settings.retry_max_gap_s),
            links=NodeLinks(self.ssh),
            pacer=RestartPacer(limit=max(1, settings.restart_limit),
                               spread_max_s=settings.restart_spread_max_s))
        # Budgets act on what the ledger measures (cost/ledger.py is their SpendMeter).
        self.budget_store = BudgetStore(self.db)
        self.meter: SpendMeter | None = self.clusters.ledger
        self.budgets: BudgetController | None = None
        # Idle clusters with no autostop, warned of (a driver each on the control engine).
        self.idle_guard = IdleGuard(self._idle_warning_after, self.store, self.clusters.ledger,
                                    self.autostop.idle_for,
                                    check_s=settings.idle_warning_check_s)
        self.loop_watch = LoopWatch()
        self.heap = Heap()
        self.cost = CostService(self.clusters.ledger, self.db, self.keeper.kept,
                                self.managed_store, self._configured_budgets,
                                self.budget_store.get)
        self.handlers = Handlers(
            self.clusters, self.jobs, self.requests, self.store, self.request_store,
            self.providers, self.refresh, self.autostop, self.orphans,
            strict_by_default=self._strict_by_default, managed=self.managed,
            managed_store=self.managed_store, storage=self.storage,
            loop_stats=lambda: {**self.loop_watch.stats(), "gc": self.heap.stats()},
            usage=UsageService(self.store, self.access),
            kept=self.keeper.kept,
            cost=self.cost,
        )
        self._server_name = f"clusterd/{__version__}"

    def _configured_budgets(self) -> tuple[Budget, ...]:
        try:
            return self.config.get().budgets
        except ProtocolError:
            return ()  # a broken config file is reported where it is used; budgets wait

    def _start_budgets(self, meter: SpendMeter) -> BudgetController:
        controller = BudgetController(
            self._configured_budgets, self.budget_store, meter, self.store, self.providers,
            RequestActions(self.requests, self.clusters, self.managed), str(self.config.path),
            poll_s=self.settings.budget_poll_s)
        self.provisioner.refusal = controller.refusal
        self.clusters.dry_run.budgets = controller
        return controller

    def _idle_warning_after(self) -> float | None:
        try:
            return self.config.get().idle_warning_after_s
        except ProtocolError:
            return None  # a broken config file is reported where it is used; no warnings

    def notices(self) -> list[Notice]:
        """Lines every clusterctl command prints (the hello's `notices` and `alerts`)."""
        budgets = self.budgets.notices() if self.budgets is not None else []
        return [*budgets, *self.idle_guard.notices()]

    def _strict_by_default(self) -> bool:
        try:
            return self.config.get().strict
        except ProtocolError:
            return False  # a broken config file is reported where its AWS settings are used

    def runner_for(self, node: NodeInfo) -> CommandRunner:
        if node.ssh is None:
            return LocalRunner(node.node_id)
        return SSHRunner(self.ssh, node.ssh, node.node_id, CURRENT_PYTHON,
                         self.settings.runtime_dir / "relay")

    def _recorded(self, provider: str) -> list[tuple[str, ProviderHandle]]:
        """(name, provider handle) of every cluster of `provider` that has one, oldest first."""
        return [(record.name, handle) for record in self.store.all()
                if record.provider == provider
                and (handle := record.handle.provider) is not None]

    async def _announce_host_key(self, target: SSHTarget, fingerprint: str) -> bool:
        """A host key met for the first time (trusted, and pinned): say so where the user
        looks, with the fingerprint to check it against."""
        text = (f"first contact with {target}: its host key {fingerprint} is now pinned; "
                "compare it with the host's own (ssh-keygen -lf /etc/ssh/ssh_host_*.pub)")
        logger.warning("new host key pinned", node=str(target), fingerprint=fingerprint)
        request = current_request.get()
        if request is None:
            return False  # `check` shows it itself
        await request.progress(text, "ssh")
        if request.cluster is not None and self.store.get(request.cluster) is not None:
            await self.store.add_event(request.cluster, "host_key", text, request.id)
        return True

    async def _tell_request(self, text: str, phase: str) -> None:
        """A provider's line for the user: in the progress of the request being served."""
        request = current_request.get()
        if request is not None:
            await request.progress(text, phase)

    async def _announce_foreign(self, cloud_name: str, text: str) -> None:
        """Another clusterd's instances or security group, found under a cluster's name and
        left alone (the provider logged it): a warning in the request's output, once per
        request, and an event of the cluster."""
        request = current_request.get()
        if request is not None and not await request.warn_once(text):
            return  # said, and kept, already
        record = next((r for r in self.store.all() if r.cloud_name == cloud_name), None)
        await self.store.add_event(record.name if record else cloud_name, "foreign", text,
                                   request.id if request else None)

    async def _provider_note(self, cloud_name: str, text: str) -> None:
        """A provider's step (kubernetes: "waiting for the autoscaler"): a progress line of
        the request in flight, and an event of the cluster."""
        request = current_request.get()
        if request is not None:
            await request.progress(text, "provision")
        record = next((r for r in self.store.all() if r.cloud_name == cloud_name), None)
        await self.store.add_event(record.name if record else cloud_name, "provision", text,
                                   request.id if request else None)

    async def _record_tunnel(self, cluster: str, state: TunnelState | None) -> None:
        """Tunnels are daemon state like any other: written down, shown by `status -v`."""
        record = self.store.get(cluster)
        if record is None:
            return
        await self.store.update(cluster, handle=dataclasses.replace(record.handle, tunnel=state))

    async def run(
        self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED
    ) -> None:
        # Signals are ours before the socket listens: a client may signal us the moment it
        # can connect, and a SIGTERM then is a clean shutdown too, not the default death.
        with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            await self._run(signals, task_status)

    async def _run(
        self, signals: AsyncIterator[int], task_status: anyio.abc.TaskStatus[None]
    ) -> None:
        settings = self.settings
        prepare_directory(settings.runtime_dir)
        prepare_directory(settings.runtime_dir / "agents")
        prepare_directory(settings.state_dir)
        with state_owner(settings.state_dir, settings.socket_path), \
                single_instance(settings.socket_path.with_suffix(".lock")):
            await self.db.open()
            try:
                await self.store.load()
                await self.managed_store.load()
                await self.clusters.ledger.load()
                await self.budget_store.load()
                interrupted = await self.request_store.mark_interrupted()
                await self.request_store.prune(settings.request_retention)
                await self._prune_ledger()
                for record in interrupted:
                    logger.warning("request interrupted by a daemon restart",
                                   request_id=record.id, op=record.op, cluster=record.cluster)
                listener, systemd_owned = await open_listener(settings.socket_path)
                try:
                    await self._serve(listener, signals, task_status)
                finally:
                    with anyio.CancelScope(shield=True):
                        await listener.aclose()
                        if not systemd_owned:
                            remove_socket(settings.socket_path)
            finally:
                with anyio.CancelScope(shield=True), anyio.move_on_after(10):
                    await self.access.close_all()
                    await self.ssh.close_all()
                    for provider in self.providers.all():
                        await provider.aclose()
                    await self.db.close()
        logger.info("stopped")

    async def _serve(
        self, listener: anyio.abc.SocketListener, signals: AsyncIterator[int],
        task_status: anyio.abc.TaskStatus[None],
    ) -> None:
        async with anyio.create_task_group() as root:
            self.requests.attach(root)
            accepting = anyio.CancelScope()
            root.start_soon(self._accept, listener, accepting)
            # The background loops, all in this one place (their periods are in
            # Settings): status refresh (at once on start, then every
            # refresh_interval_s, jittered; orphans on the first cycle and every tenth),
            # autostop timers (every autostop_check_s), event, request and cost-ledger
            # retention (hourly), the managed-jobs controller (a driver per unfinished job;
            # its health polls every Timing.poll_s), the copying of jobs' logs (a
            # keeper per UP cluster with unfinished jobs, every kept_log_interval_s),
            # the budgets (a driver each, every 30 s and on a config edit), the
            # idle-cost guard (a driver per UP cluster with no autostop, every
            # idle_warning_check_s), and the loop's own lag watch.
            await root.start(self.loop_watch.run)
            for provider in self.providers.all():
                await root.start(provider.run)
            await root.start(self.refresh.run)
            await root.start(self.autostop.run)
            await root.start(self.managed.run)
            await root.start(self.keeper.run)
            if self.meter is not None:  # the budgets (a driver each; polls every 30 s)
                self.budgets = self._start_budgets(self.meter)
                await root.start(self.budgets.run)
            await root.start(self.idle_guard.run)
            root.start_soon(self._prune_history)
            # Last: what start made (imports, loaded records) is the heap it freezes.
            await root.start(self.heap.run)
            logger.info("clusterd ready", pid=os.getpid(), version=__version__,
                        socket=str(self.settings.socket_path))
            task_status.started()
            async for signum in signals:
                logger.info("shutting down", signal=signal.Signals(signum).name)
                break
            accepting.cancel()
            with anyio.CancelScope(shield=True):
                await self.requests.shutdown(self.settings.shutdown_grace_s)
            root.cancel_scope.cancel()

    async def _prune_history(self) -> None:
        async def prune() -> None:
            # Settled first: a split settled keeps its UP times past the events' bound.
            await self.cost.settle()
            await self.store.prune_events()
            await self.request_store.prune(self.settings.request_retention)
            await self._prune_ledger()

        async def sweep_buckets() -> None:
            # Clusters removed without a `down` (found gone by a refresh, or while the daemon
            # was down) release their buckets here; a cluster being launched (its buckets are
            # made before its record) is held by its launch's lock, and an unfinished managed
            # job holds its own.
            with anyio.fail_after(900):
                await self.storage.sweep(lambda name: self.store.get(name) is not None or bool(
                    self.locks.holders(name) or self.locks.waiting(name))
                    or self.managed_store.holds_buckets(name))

        async def settle_buckets() -> None:
            with anyio.fail_after(300):
                await self.storage.settle_unfinished(self.started_at)

        await survive("unfinished bucket creates", settle_buckets)
        # Cost splits that became final while the daemon was down (or all of them, on the
        # first start of a version with settled splits): now, not in the first report asked.
        async def settle_costs() -> None:
            settled = await self.cost.settle()
            if settled:
                logger.info("cost splits settled", incarnations=settled)

        await survive("settling cost splits", settle_costs)
        while True:
            await survive("bucket sweep", sweep_buckets)
            await anyio.sleep(3600)
            await survive("retention", prune)

    async def _prune_ledger(self) -> None:
        days = self.settings.cost_retention_days
        removed = await self.clusters.ledger.prune(time.time() - days * 86400)
        if removed:
            logger.info("cost intervals past retention forgotten", removed=removed, days=days)

    async def _accept(self, listener: anyio.abc.SocketListener, scope: anyio.CancelScope) -> None:
        raise_open_files_limit()
        cap = connection_cap(self.settings.max_connections)
        logger.info("accepting connections", max_connections=cap)
        with scope:
            await serve_connections(listener, self._handle, cap)

    async def _handle(self, stream: BufferedSocketStream) -> None:
        await Connection(stream, self.handlers.dispatch, self._server_name,
                         self.settings.idle_timeout_s, notices=self.notices).serve()
