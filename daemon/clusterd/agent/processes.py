"""Stopping process trees on a node, for the node helper (Ray, the agent) and for job
cancellation (a user's script and everything it started).

Everything we start on a node is started in a session of its own (its pid is the session id),
so what it leaves behind is found by session even after the leader itself is gone: Ray, for
one, kills a dead driver's worker and that worker's direct child, orphaning the grandchildren.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time

import psutil

POLL_S = 0.05


def find(pid: int, create_time: float | None = None) -> psutil.Process | None:
    """The live process `pid`; None if it is gone, a zombie, or the pid was recycled."""
    try:
        process = psutil.Process(pid)
        if create_time is not None and abs(process.create_time() - create_time) > 1:
            return None
        if process.status() == psutil.STATUS_ZOMBIE:
            return None
        return process
    except psutil.Error:
        return None


def _running(process: psutil.Process) -> bool:
    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def wait_gone(processes: list[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until every process has exited (a zombie counts as exited: its parent reaps it,
    not us); returns those still running at the deadline."""
    deadline = time.monotonic() + timeout_s
    alive = [p for p in processes if _running(p)]
    while alive and time.monotonic() < deadline:
        time.sleep(POLL_S)
        alive = [p for p in alive if _running(p)]
    return alive


def _recycled(pid: int, create_time: float | None) -> bool:
    """A live process holds `pid` but is not the one we started."""
    if create_time is None:
        return False
    try:
        process = psutil.Process(pid)
        return abs(process.create_time() - create_time) > 1
    except psutil.Error:
        return False


def session_members(sid: int) -> list[psutil.Process]:
    """Live processes of session `sid` (the kernel keeps a sid from being reused while any
    member lives, so these are ours)."""
    members = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid and process.status() != psutil.STATUS_ZOMBIE:
                members.append(process)
        except (OSError, psutil.Error):
            continue
    return members


def _descendants(process: psutil.Process) -> list[psutil.Process]:
    try:
        return list(process.children(recursive=True))
    except psutil.Error:
        return []


def _signal(processes: list[psutil.Process], signum: int) -> None:
    for process in processes:
        with contextlib.suppress(psutil.Error):
            process.send_signal(signum)


def _signal_group(pgid: int, signum: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signum)


def stop_processes(processes: list[psutil.Process], grace_s: float,
                   group: int | None = None) -> None:
    """SIGTERM the processes (and process group `group`), SIGKILL what outlives `grace_s`,
    then wait up to `grace_s` for the killed to go."""
    if group is not None:
        _signal_group(group, signal.SIGTERM)
    _signal(processes, signal.SIGTERM)
    alive = wait_gone(processes, grace_s)
    _signal(alive, signal.SIGKILL)
    if group is not None:
        _signal_group(group, signal.SIGKILL)
    wait_gone(alive, grace_s)


def terminate_tree(
    pid: int, create_time: float | None = None, *, grace_s: float = 3.0,
    leader_first: bool = False,
) -> int:
    """SIGTERM the session `pid` leads (the leader, its descendants, every process still in
    the session or its process group); SIGKILL what outlives `grace_s`. With `leader_first`,
    the leader alone gets SIGTERM and a grace period first, so a supervisor (the agent,
    `ray start --block`) can shut its children down in order. Returns how many processes
    were found to stop; 0 if none are left or the pid now belongs to someone else."""
    if _recycled(pid, create_time):
        return 0
    root = find(pid, create_time)
    family = [root, *_descendants(root)] if root is not None else []
    family += [p for p in session_members(pid) if p not in family]
    if not family:
        return 0
    if leader_first and root is not None:
        _signal([root], signal.SIGTERM)
        wait_gone([root], grace_s)
        family += [p for p in _descendants(root) if p not in family]
    stop_processes(family, grace_s, group=pid)
    return len(family)
