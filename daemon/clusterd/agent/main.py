"""`clusterd-agent`: the gRPC server on a cluster's head node.

Connects to the cluster's Ray as a long-lived driver (so each job costs a placement group and a
few task submissions, not a new driver), serves the jobs, autostop and health services on a
Unix socket in a directory only its user can enter, and runs the FIFO scheduler. The cluster's
token comes on stdin (never argv); every call must carry a credential made from it (guard.py).
SIGTERM stops jobs and exits.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import posixpath
import signal
import sys
import time
from pathlib import Path

import anyio
import grpc
import ray
import structlog

from clusterctl._private import PRIVATE_UMASK, UnsafePath, ensure_private_dir
from clusterd import log
from clusterd.agent import node, node_tasks, ray_start, usage
from clusterd.agent.autostop import AutostopState, ContactClock
from clusterd.agent.autostop_marker import write_marker
from clusterd.agent.guard import MAX_CONCURRENT_RPCS, SERVER_OPTIONS, TokenGuard
from clusterd.agent.jobs_db import JobStore
from clusterd.agent.logs import LogHub
from clusterd.agent.scheduler import Scheduler
from clusterd.agent.service import AutostopService, HealthService, JobsService, UsageService
from clusterd.agent.v1 import agent_pb2_grpc as pb_grpc
from clusterd.node_shared.auth import NONCE_TTL_S, NonceBook
from clusterd.node_shared.node_commands import StopRequest

logger = log.get("clusterd.agent")
RESTART_REASON = "the agent restarted while the job was in progress"
JOB_PRUNE_S = 60.0
STOP_REASON = "the cluster's runtime was stopped"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="clusterd-agent", description=__doc__)
    parser.add_argument("--listen", required=True,
                        help="unix:/path/agent.sock, in a directory only this user can use")
    parser.add_argument("--state-dir", required=True, type=Path,
                        help="job queue database and job logs")
    parser.add_argument("--ray-address", required=True, help="HOST:PORT of the Ray head (GCS)")
    parser.add_argument("--cluster-name", required=True)
    parser.add_argument("--ray-connect-timeout", type=float, default=90.0)
    parser.add_argument("--ready-file", type=Path,
                        help="written with this process's pid once it serves")
    parser.add_argument("--node-run-dir", default="",
                        help="each node's run dir (pid files), '~' for the node user's home; "
                             "lets the agent stop the cluster's Ray itself")
    parser.add_argument("--autostop-grace", type=float, default=300.0,
                        help="seconds past an autostop deadline without any daemon before "
                             "the agent stops the cluster on its own")
    parser.add_argument("--shutdown-nodes", action="store_true",
                        help="when stopping the cluster on its own, also shut every node's OS "
                             "down (cloud VMs: that stops or terminates the instance)")
    parser.add_argument("--job-retention", type=int, default=1000,
                        help="job records (and their logs) kept; the oldest finished ones "
                             "beyond this are deleted")
    parser.add_argument("--nonce-ttl", type=float, default=NONCE_TTL_S,
                        help="seconds an issued nonce stays good for the daemon's credential "
                             "(tests shorten it)")
    parser.add_argument("--log-level", default="info", choices=log.LEVELS)
    return parser.parse_args(argv)


MAX_SOCKET_PATH = 107  # sun_path, with its terminating NUL


def socket_path_of(listen: str) -> Path:
    """The Unix socket to listen on. Anything else (a TCP port: any user of the host could
    connect to it) is refused, as is a directory others can use (ensure_private_dir)."""
    if not listen.startswith("unix:"):
        raise SystemExit(f"clusterd-agent: refusing to listen on {listen}: only a Unix socket "
                         "(unix:/path) in a directory of this user's own")
    path = Path(listen.removeprefix("unix:"))
    if not path.is_absolute() or len(str(path).encode()) > MAX_SOCKET_PATH:
        raise SystemExit(f"clusterd-agent: {path}: need an absolute path of at most "
                         f"{MAX_SOCKET_PATH} bytes")
    try:
        ensure_private_dir(str(path.parent))
    except UnsafePath as exc:
        raise SystemExit(f"clusterd-agent: {exc.message}; {exc.fix}") from None
    return path


def read_token() -> str:
    """The cluster's token, the first line on stdin."""
    token = sys.stdin.readline().strip()
    if len(token) < 32:
        raise SystemExit("clusterd-agent: expected the cluster's token on stdin")
    return token


def connect_ray(address: str, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    # Started beside the head's Ray: a driver whose node's raylet is not up yet looks again
    # only every second (see ray_start.py). What this finds or not, ray.init says below.
    with contextlib.suppress(Exception):
        ray_start.wait_until_registered(address, timeout_s)
    while True:
        try:
            ray.init(
                address=address,
                namespace="clusterd",
                log_to_driver=False,
                logging_level=logging.WARNING,
                configure_logging=False,
            )
            return
        except (ConnectionError, RuntimeError) as exc:
            if time.monotonic() > deadline:
                raise SystemExit(
                    f"clusterd-agent: cannot reach Ray at {address} after {timeout_s:.0f} s: {exc}"
                ) from None
            logger.info("waiting for ray", address=address, error=str(exc)[:200])
            time.sleep(0.25)  # started beside the head's Ray: it may be moments away


async def _stop_runtime(args: argparse.Namespace, scheduler: Scheduler, reason: str,
                        down: bool) -> None:
    """What autostop does: end every job, then stop Ray on every node (and shut the nodes
    down when the provider asked for that)."""
    write_marker(args.state_dir, reason, down)
    await scheduler.cancel([], cancel_all=True, reason=reason)
    with anyio.move_on_after(30):
        await scheduler.drain()
    if not args.node_run_dir:
        return
    head = ray.get_runtime_context().get_node_id()
    workers = [n for n in await scheduler.nodes() if n.node_id != head]
    for worker in workers:  # their raylets die under the tasks: no answer to wait for
        node_tasks.pinned(node_tasks.stop_node_ray, worker.node_id).remote(
            args.node_run_dir, args.shutdown_nodes)
    await anyio.sleep(5 if workers else 0)
    await anyio.to_thread.run_sync(
        node.stop, StopRequest(dir=os.path.expanduser(args.node_run_dir), parts=["ray"]))
    if args.shutdown_nodes:
        logger.warning("shutting the head node down")
        await anyio.to_thread.run_sync(node.schedule_shutdown, 1.0)


async def _keep_jobs_bounded(store: JobStore, hub: LogHub, retention: int) -> None:
    """Every minute: forget (and delete the logs of) the oldest finished jobs beyond the
    retention setting, so a long-lived cluster's head does not fill up."""
    while True:
        removed = await store.prune(max(1, retention))
        for job_id in removed:
            await anyio.to_thread.run_sync(hub.remove, job_id)
        if removed:
            logger.info("forgot old jobs", count=len(removed), oldest_kept=min(
                (j.job_id for j in store.all()), default=None))
        await anyio.sleep(JOB_PRUNE_S)


async def _sample_usage(scheduler: Scheduler, rings: usage.UsageRings) -> None:
    """Every interval: each node's CPU, memory and GPU use, into its ring (usage.py). The
    first round measures CPU over a short window: it has no sample before it."""
    window_s = usage.FIRST_WINDOW_S
    while True:
        for found in await scheduler.on_every_node(node_tasks.read_usage, window_s,
                                                   timeout_s=rings.interval_s):
            if found is not None:
                rings.record(str(found["node_id"]), str(found["ip"]), found)
        rings.forget_gone(time.time())
        window_s = 0.0
        await anyio.sleep(rings.interval_s)


async def _listen(args: argparse.Namespace, store: JobStore, hub: LogHub,
                  scheduler: Scheduler, contact: ContactClock,
                  autostop: AutostopState, rings: usage.UsageRings) -> grpc.aio.Server:
    """The agent's gRPC services on its Unix socket (this user's alone), started."""
    nonces = NonceBook(ttl_s=args.nonce_ttl)
    server = grpc.aio.server(interceptors=[TokenGuard(args.token, nonces)],
                             options=SERVER_OPTIONS, maximum_concurrent_rpcs=MAX_CONCURRENT_RPCS)
    pb_grpc.add_JobsServiceServicer_to_server(JobsService(store, hub, scheduler, contact), server)
    pb_grpc.add_AutostopServiceServicer_to_server(AutostopService(autostop, contact), server)
    pb_grpc.add_HealthServiceServicer_to_server(
        HealthService(scheduler, contact, args.token, nonces), server)
    pb_grpc.add_UsageServiceServicer_to_server(UsageService(rings, contact), server)
    socket_path: Path = args.socket_path
    socket_path.unlink(missing_ok=True)
    if server.add_insecure_port(f"unix:{socket_path}") == 0:
        raise SystemExit(f"clusterd-agent: cannot listen on {socket_path}")
    await server.start()
    os.chmod(socket_path, 0o600)
    return server


async def serve(args: argparse.Namespace) -> None:
    state_dir: Path = args.state_dir
    store = JobStore(state_dir / "jobs.db")
    await store.open()
    hub = LogHub(state_dir / "jobs")
    # Bucket mounts keep their state beside each node's run dir (see storage/service.py).
    mounts_dir = posixpath.join(posixpath.dirname(args.node_run_dir.rstrip("/")),
                                node.MOUNTS) if args.node_run_dir else ""
    scheduler = Scheduler(store, hub, args.cluster_name, mounts_dir)
    contact = ContactClock()

    async def count_ssh_sessions() -> int:
        return sum(n or 0 for n in await scheduler.on_every_node(node_tasks.ssh_sessions))

    autostop = AutostopState(store, scheduler, contact, count_ssh_sessions)
    await autostop.load()
    stopped_on_our_own = anyio.Event()

    async def stop_runtime(reason: str, down: bool) -> None:
        await _stop_runtime(args, scheduler, reason, down)
        stopped_on_our_own.set()

    failed = await scheduler.fail_in_progress(RESTART_REASON)
    if failed:
        logger.warning("failed jobs left over from a previous agent", job_ids=failed)
    rings = usage.UsageRings()
    rings.head_node_id = ray.get_runtime_context().get_node_id()
    server = await _listen(args, store, hub, scheduler, contact, autostop, rings)
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        # Ready (the pid a stop signals) only once a SIGTERM would be a clean stop.
        logger.info("agent serving", listen=args.listen, pid=os.getpid())
        if args.ready_file is not None:
            args.ready_file.write_text(str(os.getpid()))
        async with anyio.create_task_group() as group:
            await group.start(scheduler.run)
            group.start_soon(autostop.sample_ssh_sessions)
            group.start_soon(_keep_jobs_bounded, store, hub, args.job_retention)
            group.start_soon(_sample_usage, scheduler, rings)
            group.start_soon(autostop.enforce, args.autostop_grace,
                             min(10.0, max(1.0, args.autostop_grace / 4)), stop_runtime)

            async def on_signal() -> None:
                async for signum in signals:
                    logger.info("stopping", signal=signal.Signals(signum).name)
                    stopped_on_our_own.set()
                    return

            group.start_soon(on_signal)
            await stopped_on_our_own.wait()
            with anyio.move_on_after(20, shield=True):
                await scheduler.cancel([], cancel_all=True, reason=STOP_REASON)
                await scheduler.drain()
                await server.stop(grace=1.0)
            group.cancel_scope.cancel()
    await store.close()
    args.socket_path.unlink(missing_ok=True)


def main(argv: list[str] | None = None) -> None:
    os.umask(PRIVATE_UMASK)  # job DB, logs, socket: this user's alone
    args = parse_args(argv)
    args.socket_path = socket_path_of(args.listen)
    args.token = read_token()
    log.configure(args.log_level)
    structlog.contextvars.bind_contextvars(cluster=args.cluster_name)
    connect_ray(args.ray_address, args.ray_connect_timeout)
    try:
        anyio.run(serve, args)
    finally:
        logger.info("agent exiting")
        sys.stdout.flush()
        sys.stderr.flush()
        # Not ray.shutdown(): with the Ray head already gone (a stop, an autostop) it waits
        # on a GCS that will never answer. The job queue is closed; the GCS notices we left.
        os._exit(0)


if __name__ == "__main__":
    main()
