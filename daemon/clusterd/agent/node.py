"""Node-side helper: start and stop a cluster's Ray and agent on one node.

The daemon runs `python -m clusterd.agent.node COMMAND -` on each node, JSON on stdin (through
a local process for the `local` provider, an SSH channel otherwise), and reads one JSON object
back. It carries data,
not scripts: all the logic is here, in the same package the daemon ships to its nodes.

Processes are started in sessions of their own (so they outlive the command that started
them) and recorded in pid files with their start times, so a recycled pid is never killed.
"""

from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from clusterctl._private import (
    PRIVATE_UMASK,
    UnsafePath,
    ensure_private_dir,
    write_private_file,
)
from clusterd.agent.autostop_marker import clear_marker, read_marker
from clusterd.agent.git_checkout import git_checkout
from clusterd.agent.helper_error import HelperError
from clusterd.agent.node_spawn import (
    connectable,
    head_address,
    home_expanded,
    read_pidfile,
    spawn_recorded,
    tail,
    wait_for_head,
    wait_ready,
)
from clusterd.agent.processes import terminate_tree
from clusterd.node_shared.node_commands import (
    TYPED_REQUESTS,
    BadRequest,
    BucketCopyReply,
    BucketCopyRequest,
    BucketFlushReply,
    BucketFlushRequest,
    BucketMountReply,
    BucketMountRequest,
    BucketUnmountReply,
    BucketUnmountRequest,
    CleanupReply,
    CleanupRequest,
    ContainerRuntimeReply,
    ContainerRuntimeRequest,
    FreePortsReply,
    FreePortsRequest,
    GitCheckoutRequest,
    Message,
    PathReply,
    ProcessState,
    RcloneReply,
    RcloneRequest,
    ReadTokenReply,
    ReadTokenRequest,
    Request,
    StartAgentReply,
    StartAgentRequest,
    StartRayReply,
    StartRayRequest,
    StatusReply,
    StatusRequest,
    StopReply,
    StopRequest,
    WritePrivateRequest,
)

MARKER = ".clusterd-runtime"
MOUNTS = "mounts"  # beside run/: the bucket mounts' state (see bucket_mount.py)
RAY_PORT_FLAGS = {
    "node_manager_port": "--node-manager-port",
    "object_manager_port": "--object-manager-port",
    "dashboard_port": "--dashboard-port",
    "dashboard_agent_listen_port": "--dashboard-agent-listen-port",
    "dashboard_agent_grpc_port": "--dashboard-agent-grpc-port",
    "metrics_export_port": "--metrics-export-port",
    "runtime_env_agent_port": "--runtime-env-agent-port",
    "min_worker_port": "--min-worker-port",
    "max_worker_port": "--max-worker-port",
}


# -- commands -----------------------------------------------------------------------------------


RAY_TEMP_ROOT = "/tmp/clusterd-ray-{uid}"
HEAD_REACH_S = 15.0  # how long a worker tries to reach the head before it says it cannot
RAY_NOTICES_DEATH_S = 3.0  # `ray start --block` polls its processes once a second


def ray_temp_dir(key: str) -> Path:
    # Ray puts Unix sockets under its temp dir and their paths must stay under 107 bytes, so
    # it gets a short path of its own, per user (several users may share a host). Ray makes
    # its subdirectories 0777: they are safe only inside a directory of ours that nobody
    # else can enter (see private_ray_root).
    return Path(RAY_TEMP_ROOT.format(uid=os.getuid())) / key


def private_ray_root() -> Path:
    """The parent of this user's Ray temp dirs, made (0700) or checked: in a shared /tmp,
    another user could have made it first to read (or plant) Ray's sockets and logs."""
    root = RAY_TEMP_ROOT.format(uid=os.getuid())
    try:
        ensure_private_dir(root)
    except UnsafePath as exc:
        raise HelperError(f"{exc.message}; {exc.fix}") from None
    return Path(root)


def read_token(request: ReadTokenRequest) -> ReadTokenReply:
    return ReadTokenReply(token=Path(request.path).expanduser().read_text().strip())


def write_token(request: WritePrivateRequest) -> PathReply:
    """Write a small secret (the cluster's Ray auth token, where RAY_AUTH_TOKEN_PATH will
    point; AWS credentials) to a file of mode 0600."""
    path = Path(request.path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        f.write(request.token)
    return PathReply(path=str(path))


def _ray_start_argv(argv: list[str], held: bool) -> list[str]:
    """`ray start ...` (argv) as this runtime's Python runs it (see ray_start.py)."""
    return [sys.executable, "-m", "clusterd.agent.ray_start", "held" if held else "now",
            *argv[1:]]


def _start_worker_ray(argv: list[str], log_path: Path, pid_path: Path, env: dict[str, str],
                      head_address: str, node_ip: str, timeout: float) -> int:
    """Start a worker's Ray (argv: `ray start ...`) beside the head's: imported at once, let
    go once the head's GCS port takes connections (silence there is a firewall, said at
    once). It then waits (ray_start.py) for the head's node to register, as Ray needs."""
    held: list[IO[bytes]] = []
    pid = spawn_recorded(_ray_start_argv(argv, held=True), log_path, pid_path, env, held=held)
    with held[0] as go:
        try:
            wait_for_head(head_address, node_ip, HEAD_REACH_S, timeout)
        except HelperError:
            go.close()  # it ends at end of file; stopped too, should it be slow to see it
            _terminate(pid_path, 5.0)
            raise
        with contextlib.suppress(BrokenPipeError):  # it died: its log says why, below
            go.write(b"go\n")
    return pid


def start_ray(request: StartRayRequest) -> StartRayReply:
    run_dir = Path(request.dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MARKER).touch()
    pid_path, log_path = run_dir / "ray.pid", run_dir / "ray.log"
    existing = read_pidfile(pid_path)
    if existing is not None:
        return StartRayReply(started=False, pid=existing.pid)
    if request.mark:  # marked as ours, so `down` may remove the whole directory
        mark(request.mark)
    if request.token:
        write_token(WritePrivateRequest(path=request.token_path, token=request.token))
    private_ray_root()
    temp_dir = ray_temp_dir(request.temp_key)
    temp_dir.mkdir(mode=0o700, exist_ok=True)
    (temp_dir / MARKER).touch()
    argv = [
        "ray", "start", "--block", "--disable-usage-stats",
        # Nothing of ours reads what these would give: the agent's driver takes no worker
        # output (log_to_driver=False), and the daemon, not Ray's autoscaler, adds nodes.
        "--include-log-monitor=false",
        f"--temp-dir={temp_dir}",
        f"--node-ip-address={request.node_ip}",
        # Whole CPUs, rounded up: a pod of 0.5 CPU is one to Ray, where its task of 0.5 fits.
        f"--num-cpus={math.ceil(float(request.num_cpus))}",
        f"--num-gpus={round(float(request.num_gpus))}",
        f"--object-store-memory={int(request.object_store_bytes)}",
        "--log-style=record",
        "--log-color=false",
    ]
    if request.resources:
        argv.append(f"--resources={json.dumps(request.resources)}")
    for key, flag in RAY_PORT_FLAGS.items():
        if key in request.ports:
            argv.append(f"{flag}={int(request.ports[key])}")
    timeout = float(request.timeout)
    offset = log_path.stat().st_size if log_path.exists() else 0
    env = {"RAY_USAGE_STATS_ENABLED": "0", **home_expanded(request.env)}
    if request.head:
        if request.gcs_port is None:
            raise HelperError("a Ray head needs its gcs_port")
        argv += ["--head", f"--port={int(request.gcs_port)}", "--include-dashboard=false",
                 "--no-monitor"]
        address = f"{request.node_ip}:{int(request.gcs_port)}"
        pid = spawn_recorded(_ray_start_argv(argv, held=False), log_path, pid_path, env)
    else:
        argv.append(f"--address={request.head_address}")
        address = ""
        pid = _start_worker_ray(argv, log_path, pid_path, env, request.head_address,
                                request.node_ip, timeout)

    def started() -> bool:
        # `ray start` says so once its processes are up (and the node registered).
        with open(log_path, "rb") as log:
            log.seek(offset)
            return b"Ray runtime started" in log.read()

    what = "Ray head" if address else "Ray worker"
    try:
        wait_ready(pid_path, log_path, what,
                    lambda: started() and (not address or connectable(address)), timeout)
    except HelperError:
        _terminate(pid_path, 5.0)  # not left trying on its own
        raise
    # A node started again (stopped, rebooted) gets its bucket mounts back.
    return StartRayReply(started=True, pid=pid,
                         remounted=remount_buckets(str(run_dir.parent / MOUNTS)))


def agent_socket(listen: str) -> Path:
    """The agent's socket path (`unix:~/...` expanded), in a directory made private (0700)
    or checked to be: other users of the host must not reach (or plant) the agent's socket."""
    if not listen.startswith("unix:"):
        raise HelperError(f"the agent listens only on a Unix socket, not {listen}")
    path = Path(listen.removeprefix("unix:")).expanduser()
    if len(str(path).encode()) > 107:
        raise HelperError(f"the agent's socket path {path} is longer than 107 bytes")
    try:
        ensure_private_dir(str(path.parent))
    except UnsafePath as exc:
        raise HelperError(f"{exc.message}; {exc.fix}") from None
    return path


def start_agent(request: StartAgentRequest) -> StartAgentReply:
    """Start the cluster's agent unless it runs with the same token. The token (in the
    request, which comes on stdin) goes to a 0600 file beside its pid file and to the agent's
    stdin; without one in the request, the file's is used (a restart by hand)."""
    run_dir = Path(request.dir).expanduser()
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / MARKER).touch()
    pid_path, log_path = run_dir / "agent.pid", run_dir / "agent.log"
    ready_path, token_path = run_dir / "agent.ready", run_dir / "agent.token"
    socket_path = agent_socket(request.listen)
    token = request.token
    try:
        recorded = token_path.read_text().strip()
    except FileNotFoundError:
        recorded = None
    token = token or recorded
    if not token:
        raise HelperError(f"no token for the agent: none given and {token_path} is missing")
    existing = read_pidfile(pid_path)
    if existing is not None and recorded == token:
        return StartAgentReply(started=False, pid=existing.pid, socket=str(socket_path))
    if existing is not None:  # it runs with another token: the daemon could not use it
        _terminate(pid_path, float(request.agent_grace))
    write_private_file(str(token_path), token.encode())
    # A killed agent's socket can accept connections for a moment after its death, so only
    # the new agent's own word (its pid in the ready file) says it is serving.
    ready_path.unlink(missing_ok=True)
    # A runtime starting again is no longer one its agent stopped on its own.
    clear_marker(Path(request.state_dir).expanduser())
    argv = [
        sys.executable, "-m", "clusterd.agent.main",
        f"--listen=unix:{socket_path}",
        f"--state-dir={Path(request.state_dir).expanduser()}",
        f"--ray-address={request.ray_address}",
        f"--cluster-name={request.cluster_name}",
        f"--log-level={request.log_level}",
        f"--ready-file={ready_path}",
        f"--node-run-dir={request.node_run_dir}",
        f"--autostop-grace={float(request.autostop_grace)}",
        f"--job-retention={int(request.job_retention)}",
    ]
    if request.nonce_ttl:
        argv.append(f"--nonce-ttl={float(request.nonce_ttl)}")
    if request.shutdown_nodes:
        argv.append("--shutdown-nodes")
    pid = spawn_recorded(argv, log_path, pid_path, home_expanded(request.env),
                          stdin=f"{token}\n".encode())

    def serving() -> bool:
        try:
            return ready_path.read_text().strip() == str(pid)
        except FileNotFoundError:
            return False

    try:
        wait_ready(pid_path, log_path, "clusterd-agent", serving, float(request.timeout))
    except HelperError:
        _raise_if_ray_died(request.node_run_dir)
        raise
    return StartAgentReply(started=True, pid=pid, socket=str(socket_path))


def _raise_if_ray_died(ray_run_dir: str | None) -> None:
    """An agent fails to start when the head's Ray dies under it: Ray says it started once
    its GCS serves, and a raylet that fails a moment later (a bad setting) takes the GCS down
    with it. Then Ray's own log says why, not the agent's crash."""
    if not ray_run_dir:
        return
    run_dir = Path(ray_run_dir).expanduser()
    if not (run_dir / "ray.log").exists():
        return
    # `ray start --block` looks at its processes once a second and then stops the rest.
    deadline = time.monotonic() + RAY_NOTICES_DEATH_S
    while read_pidfile(run_dir / "ray.pid") is not None:
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)
    raise HelperError(f"Ray head exited while the agent was starting:\n"
                      f"{tail(run_dir / 'ray.log')}")


def _terminate(pid_path: Path, grace_s: float) -> bool:
    """Stop the recorded process (alone first: it stops its own children) and its tree."""
    record = read_pidfile(pid_path)
    stopped = record is not None and terminate_tree(
        record.pid, record.create_time(), grace_s=grace_s, leader_first=True) > 0
    pid_path.unlink(missing_ok=True)
    return stopped


def stop(request: StopRequest) -> StopReply:
    """Stop the agent, then Ray (or only the `parts` named). The agent goes first: it cancels
    its jobs, killing their process trees, while Ray still runs to carry the kills."""
    run_dir = Path(request.dir).expanduser()
    agent_stopped = ray_stopped = None
    if "agent" in request.parts:
        agent_stopped = _terminate(run_dir / "agent.pid", float(request.agent_grace))
    if "ray" in request.parts:
        ray_stopped = _terminate(run_dir / "ray.pid", float(request.ray_grace))
        # The node's runtime stops: its bucket mounts too (start-ray remounts).
        s3_unmount(BucketUnmountRequest(state=str(run_dir.parent / MOUNTS), keep=True))
    return StopReply(agent_stopped=agent_stopped, ray_stopped=ray_stopped)


def schedule_shutdown(delay_s: float = 2.0) -> None:
    """Power this node off in `delay_s`, from a process of its own: stopping Ray (whose
    process tree the caller may be part of) must not take the shutdown along."""
    command = (f"(sleep {delay_s:g}; sudo -n shutdown -h now || shutdown -h now) "
               ">/dev/null 2>&1 &")
    subprocess.run(["sh", "-c", command], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL, start_new_session=True, check=False, timeout=10)


def status(request: StatusRequest) -> StatusReply:
    run_dir = Path(request.dir).expanduser()
    ray = read_pidfile(run_dir / "ray.pid")
    agent = read_pidfile(run_dir / "agent.pid")
    return StatusReply(
        ray=ProcessState(alive=ray is not None, pid=ray.pid if ray else None,
                         address=head_address(ray) if ray is not None else None),
        agent=ProcessState(alive=agent is not None, pid=agent.pid if agent else None),
        # Left by an agent that stopped the cluster on its own (see agent/autostop.py).
        autostopped=read_marker(run_dir.parent / "agent"))


def cleanup(request: CleanupRequest) -> CleanupReply:
    """Remove runtime directories, but only ones this helper created (they hold MARKER)."""
    removed = []
    paths = [Path(p).expanduser() for p in request.paths]
    paths += [ray_temp_dir(key) for key in request.ray_temp_keys]
    for path in paths:
        if path.is_dir() and ((path / MARKER).exists() or request.force):
            # Bucket mounts first: a mount point below would otherwise be emptied into its
            # bucket by the removal.
            s3_unmount(BucketUnmountRequest(state=str(path / MOUNTS)))
            shutil.rmtree(path, ignore_errors=True)
            removed.append(str(path))
    return CleanupReply(removed=removed)


def free_ports(request: FreePortsRequest) -> FreePortsReply:
    """Ports free on this node right now (all held open together, so they are distinct)."""
    sockets = []
    try:
        for _ in range(int(request.count)):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((request.host, 0))
            sockets.append(sock)
        return FreePortsReply(ports=[s.getsockname()[1] for s in sockets])
    finally:
        for sock in sockets:
            sock.close()


def mark(directory: str) -> None:
    """Mark the directory as made by this helper (`cleanup` removes only such)."""
    path = Path(directory).expanduser()
    path.mkdir(parents=True, exist_ok=True)
    (path / MARKER).touch()


def container_runtime(request: ContainerRuntimeRequest) -> ContainerRuntimeReply:
    """Which container runtime answers on this node (for docker:IMAGE tasks), or why none."""
    from clusterd.node_shared.containers import find_runtime

    runtime, why = find_runtime()
    return ContainerRuntimeReply(runtime=runtime, why=why)


# The bucket commands (their errors are HelperErrors), imported only when one runs: the
# other commands start without their modules (about a quarter of the helper's import time).


def s3_copy(request: BucketCopyRequest) -> BucketCopyReply:
    from clusterd.agent import bucket_copy

    return bucket_copy.copy(request)


def s3_mount(request: BucketMountRequest) -> BucketMountReply:
    from clusterd.agent import bucket_mount

    return bucket_mount.mount(request)


def s3_rclone(request: RcloneRequest) -> RcloneReply:
    from clusterd.agent import bucket_mount

    return bucket_mount.usable_rclone(request)


def s3_flush(request: BucketFlushRequest) -> BucketFlushReply:
    from clusterd.agent import bucket_mount

    return bucket_mount.flush(request)


def s3_unmount(request: BucketUnmountRequest) -> BucketUnmountReply:
    from clusterd.agent import bucket_mount

    return bucket_mount.unmount_all(request)


def remount_buckets(state: str) -> list[str]:
    from clusterd.agent import bucket_mount

    return bucket_mount.remount(state)


# Each command with its typed request (node_shared/node_commands.py, shared with the daemon).
TYPED_COMMANDS: dict[type[Request[Any]], Callable[[Any], Message]] = {
    StartRayRequest: start_ray,
    StartAgentRequest: start_agent,
    WritePrivateRequest: write_token,
    ReadTokenRequest: read_token,
    StopRequest: stop,
    StatusRequest: status,
    CleanupRequest: cleanup,
    FreePortsRequest: free_ports,
    GitCheckoutRequest: git_checkout,
    ContainerRuntimeRequest: container_runtime,
    BucketCopyRequest: s3_copy,
    BucketMountRequest: s3_mount,
    RcloneRequest: s3_rclone,
    BucketFlushRequest: s3_flush,
    BucketUnmountRequest: s3_unmount,
}
REQUEST_TYPES = {request.command: request for request in TYPED_REQUESTS}


def _typed(request_type: type[Request[Any]]) -> Callable[[dict[str, Any]], dict[str, Any]]:
    def command(params: dict[str, Any]) -> dict[str, Any]:
        return TYPED_COMMANDS[request_type](request_type.from_dict(params)).to_dict()

    return command


COMMANDS: dict[str, Callable[[dict[str, Any]], dict[str, Any]]] = {
    name: _typed(request) for name, request in REQUEST_TYPES.items()}


def main(argv: list[str] | None = None) -> int:
    # What the helper writes (pid files, logs, tokens) and what it starts (Ray, the agent)
    # is for this user alone. Jobs get the usual umask back (agent/node_tasks.py).
    os.umask(PRIVATE_UMASK)
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 2 or args[0] not in COMMANDS:
        print(json.dumps({"error": f"usage: node.py {{{','.join(COMMANDS)}}} JSON"}))
        return 2
    try:
        # "-" reads the parameters from stdin: secrets (the Ray token) never show in argv.
        params = json.loads(sys.stdin.read() if args[1] == "-" else args[1])
        result = COMMANDS[args[0]](params)
    except (HelperError, BadRequest) as exc:
        print(json.dumps({"error": str(exc)}))
        return 1
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
