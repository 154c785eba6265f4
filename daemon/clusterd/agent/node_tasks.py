"""Ray tasks that run on a job's nodes: a user script, streamed back; a process tree, killed.

These run inside Ray workers on every node, from the same installed package as the agent, so
what crosses to them is data (script text, environment), never generated code.
"""

from __future__ import annotations

import contextlib
import fcntl
import getpass
import os
import select
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil
import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from clusterd.agent import usage
from clusterd.agent.processes import stop_processes, terminate_tree
from clusterd.node_shared import containers
from clusterd.node_shared.node_commands import BucketFlushRequest, StopRequest

READ_BYTES = 64 * 1024
# While output keeps coming, chunks grow up to this: each chunk crosses Ray as an object, so
# a flood in big chunks costs far less than in pipe-sized ones, and a trickle still goes out
# line by line at once.
MAX_CHUNK_BYTES = 4 * 1024 * 1024
PIPE_BYTES = 1024 * 1024
KILL_GRACE_S = 3.0
F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)  # Linux
JOB_UMASK = 0o022


@contextlib.contextmanager
def _script_file(script: str) -> Iterator[str]:
    """`script` in a file of its own (a single argv entry is limited to 128 KiB on Linux), in a
    fresh 0700 directory: only this user (the job) can read it, whoever else shares the
    node's /tmp. Removed afterwards."""
    holder = tempfile.mkdtemp(prefix="clusterd-job-")
    try:
        path = os.path.join(holder, "script.sh")
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(script)
        yield path
    finally:
        shutil.rmtree(holder, ignore_errors=True)


def _container_argv(image: str, script_path: str, workdir: str,
                    env: dict[str, str]) -> tuple[list[str], str]:
    """The argv running the script in `image`, or why it cannot run (for the job's log)."""
    try:
        containers.check_image(image)
    except containers.BadImage as exc:
        return [], f"resources.image_id: docker:IMAGE: {exc}"
    runtime, why = containers.find_runtime()
    if runtime is None:
        return [], (f"resources.image_id: docker:{image} needs a container runtime on this "
                    f"node: {why}")
    # The image may run as any of its users: the file is readable by all of them, and
    # mounted alone; on the node, its directory keeps everyone else out.
    os.chmod(script_path, 0o644)
    return containers.command(runtime, image, script_path, workdir, list(env)), ""


def _run_script(script: str, env: dict[str, str], cwd: str,
                image: str = "") -> Iterator[tuple[str, Any]]:
    """Run `script` with bash (in container `image`, if given); yield ("started", {pid,
    create_time}), then ("output", bytes) as it arrives, then ("exit", code). Codes follow
    the shell: 128 + N for signal N."""
    workdir = os.path.expanduser(cwd) if cwd else os.path.expanduser("~")
    # As SkyPilot's ~/sky_workdir: there even when the task syncs no workdir.
    os.makedirs(workdir, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    with _script_file(script) as script_path:
        argv = ["/bin/bash", script_path]
        if image:
            argv, problem = _container_argv(image, script_path, workdir, env)
            if problem:
                yield "output", f"clusterd: {problem}\n".encode()
                yield "exit", 127
                return
        process = subprocess.Popen(
            argv,
            cwd=workdir,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so cancel reaches every child
            # Ray and the agent run with umask 077 (their files are private); the user's
            # own job makes files the way a login shell would.
            umask=JOB_UMASK,
        )
        assert process.stdout is not None
        started = psutil.Process(process.pid).create_time()
        yield "started", {"pid": process.pid, "create_time": started}
        fd = process.stdout.fileno()
        with contextlib.suppress(OSError):  # a bigger pipe lets a fast writer run ahead
            fcntl.fcntl(fd, F_SETPIPE_SZ, PIPE_BYTES)
        while chunk := _read_available(fd):
            yield "output", chunk
        code = process.wait()
        yield "exit", 128 - code if code < 0 else code


run_script = ray.remote(num_cpus=0, max_retries=0)(_run_script)


def _read_available(fd: int) -> bytes:
    """Block for some output, then take whatever else is already there (up to a bound)."""
    chunk = os.read(fd, READ_BYTES)
    if not chunk:
        return b""
    parts, size = [chunk], len(chunk)
    while size < MAX_CHUNK_BYTES and select.select([fd], [], [], 0)[0]:
        more = os.read(fd, READ_BYTES)
        if not more:
            break  # EOF: the next call returns b"" too
        parts.append(more)
        size += len(more)
    return b"".join(parts)


def kill_process_tree(pid: int, create_time: float | None = None) -> int:
    """Stop a job's process on this node with everything it started (see terminate_tree)."""
    return terminate_tree(pid, create_time, grace_s=KILL_GRACE_S)


kill_tree = ray.remote(num_cpus=0, max_retries=0)(kill_process_tree)

# Set in every job process's environment to the job's task id (runner.skypilot_env).
JOB_TAG = "CLUSTERD_JOB"


def kill_tagged_processes(task_id: str) -> int:
    """Stop every process of this user on this node whose environment names the job: it
    finds what a job left behind even when its pids were never recorded."""
    victims = []
    for process in psutil.process_iter():
        try:
            if process.environ().get(JOB_TAG) == task_id:
                victims.append(process)
        except (psutil.Error, OSError):
            continue  # another user's process, or gone
    stop_processes(victims, KILL_GRACE_S)
    return len(victims)


kill_tagged = ray.remote(num_cpus=0, max_retries=0)(kill_tagged_processes)


def _ssh_sessions() -> int:
    """Interactive SSH sessions of this node's user: sshd names a session's process
    "sshd: USER@pts/N" when it has a terminal, and runs it as that user. The daemon never asks
    for a terminal, so its own connections do not count; nor does utmp matter (not every host
    keeps one). Only processes of this user count: anyone can name a process "sshd: ...", and
    another user must not keep the cluster up by doing so."""
    marker = f"{getpass.getuser()}@pts/"
    uid = os.getuid()
    count = 0
    for process in psutil.process_iter(["cmdline", "uids"]):
        cmdline = " ".join(process.info.get("cmdline") or [])
        uids = process.info.get("uids")
        if (cmdline.startswith("sshd:") and marker in cmdline and uids is not None
                and uids.real == uid and uids.effective == uid):
            count += 1
    return count


ssh_sessions = ray.remote(num_cpus=0, max_retries=0)(_ssh_sessions)


def _read_usage(window_s: float) -> dict[str, Any]:
    """This node's CPU, memory and GPU counters (usage.read_counters), with its Ray node id
    and address."""
    return {**usage.read_counters(window_s), "node_id": ray.get_runtime_context().get_node_id(),
            "ip": ray.util.get_node_ip_address()}


read_usage = ray.remote(num_cpus=0, max_retries=0)(_read_usage)


def _stop_node_ray(run_dir: str, shutdown: bool = False) -> dict[str, Any]:
    """Stop this node's Ray, and with `shutdown` then its OS (from inside it: the caller
    should not wait for an answer)."""
    from clusterd.agent import node

    if shutdown:
        node.schedule_shutdown(delay_s=3.0)
    return node.stop(StopRequest(dir=run_dir, parts=["ray"])).to_dict()


stop_node_ray = ray.remote(num_cpus=0, max_retries=0)(_stop_node_ray)


def _flush_bucket_mounts(state: str, timeout_s: float) -> dict[str, Any]:
    """Wait until this node's bucket mounts have uploaded what was written to them."""
    from clusterd.agent import bucket_mount

    return bucket_mount.flush(BucketFlushRequest(state=state, timeout=timeout_s)).to_dict()


flush_bucket_mounts = ray.remote(num_cpus=0, max_retries=0)(_flush_bucket_mounts)


def pinned(task: Any, node_id: str) -> Any:
    """`task`, to run on that node only: with the node gone it fails, never runs elsewhere."""
    return task.options(
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=node_id, soft=False))
