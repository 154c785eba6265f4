"""Ray tasks that run on a job's nodes: a user script, streamed back; a process tree, killed.

These run inside Ray workers on every node, from the same installed package as the agent, so
what crosses to them is data (script text, environment), never generated code.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from typing import Any

import psutil
import ray

READ_BYTES = 64 * 1024
KILL_GRACE_S = 3.0


def _run_script(script: str, env: dict[str, str], cwd: str) -> Iterator[tuple[str, Any]]:
    """Run `script` with bash; yield ("started", {pid, create_time}), then ("output", bytes)
    as it arrives, then ("exit", code). Codes follow the shell: 128 + N for signal N."""
    workdir = os.path.expanduser(cwd) if cwd else os.path.expanduser("~")
    # As SkyPilot's ~/sky_workdir: there even when the task syncs no workdir.
    os.makedirs(workdir, exist_ok=True)
    full_env = dict(os.environ)
    full_env.update(env)
    full_env.setdefault("PYTHONUNBUFFERED", "1")
    # The script goes through a file: a single argv entry is limited to 128 KiB on Linux.
    with tempfile.NamedTemporaryFile("w", prefix="clusterd-", suffix=".sh", delete=False) as f:
        f.write(script)
        script_path = f.name
    try:
        process = subprocess.Popen(
            ["/bin/bash", script_path],
            cwd=workdir,
            env=full_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, so cancel reaches every child
        )
        assert process.stdout is not None
        started = psutil.Process(process.pid).create_time()
        yield "started", {"pid": process.pid, "create_time": started}
        fd = process.stdout.fileno()
        while True:
            # os.read returns whatever is there: small writes go out at once, floods in 64 KiB.
            chunk = os.read(fd, READ_BYTES)
            if not chunk:
                break
            yield "output", chunk
        code = process.wait()
        yield "exit", 128 - code if code < 0 else code
    finally:
        os.unlink(script_path)


run_script = ray.remote(num_cpus=0, max_retries=0)(_run_script)


def kill_process_tree(pid: int, create_time: float | None = None) -> int:
    """SIGTERM a process, its group and all its descendants; SIGKILL what is left after a grace
    period. Returns how many processes were signalled. A recycled pid is left alone."""
    try:
        root = psutil.Process(pid)
        if create_time is not None and abs(root.create_time() - create_time) > 1:
            return 0
        victims = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return 0
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGTERM)
    for proc in victims:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.terminate()
    _, alive = psutil.wait_procs(victims, timeout=KILL_GRACE_S)
    for proc in alive:
        with contextlib.suppress(psutil.NoSuchProcess):
            proc.kill()
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)
    psutil.wait_procs(alive, timeout=KILL_GRACE_S)
    return len(victims)


kill_tree = ray.remote(num_cpus=0, max_retries=0)(kill_process_tree)


