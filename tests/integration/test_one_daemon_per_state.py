"""One clusterd per state directory, whatever its socket: a second daemon for the same state
(another socket, another login session's XDG_RUNTIME_DIR) is refused, naming the one that
runs, and a clusterctl that would autostart it says which socket serves the state."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from clusterctl import Client, PingArgs
from clusterd.app import daemon_id
from tests.support import CLUSTERCTL, make_env, short_tempdir, wait_for

ROUNDS = 12


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("cds-")
    try:
        yield path
    finally:
        for process in daemons_under(path):
            process.kill()
        shutil.rmtree(path, ignore_errors=True)


def daemons_under(root: Path) -> list[psutil.Process]:
    found = []
    for process in psutil.process_iter(["cmdline"]):
        if (process.info["cmdline"] or [])[1:3] != ["-m", "clusterd"]:
            continue
        try:
            if process.environ().get("XDG_STATE_HOME", "").startswith(str(root)):
                found.append(process)
        except psutil.Error:
            continue
    return found


def session_env(root: Path, session: str, state: str = "state") -> dict[str, str]:
    """A login session's environment: its own runtime dir (so its own socket), and the
    state directory `state` (shared between sessions of one user)."""
    env = make_env(root)
    runtime = root / f"rt-{session}"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env["XDG_RUNTIME_DIR"] = str(runtime)
    env["XDG_STATE_HOME"] = str(root / state)
    return env


def socket_of(env: dict[str, str]) -> str:
    return str(Path(env["XDG_RUNTIME_DIR"]) / "clusterd" / "clusterd.sock")


def answers(socket_path: str) -> int | None:
    """The pid of the daemon answering on `socket_path`, if one does."""
    try:
        with Client(socket_path, autostart=False, connect_timeout=2) as client:
            return int(client.call(PingArgs())["pid"])
    except Exception:
        return None


def start(env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-m", "clusterd"], env=env, text=True,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                            start_new_session=True)


def settled(processes: list[subprocess.Popen[str]], envs: list[dict[str, str]]) -> bool:
    """One of the two serves its socket, and the other has exited."""
    running = [p for p, env in zip(processes, envs, strict=True)
               if p.poll() is None and answers(socket_of(env)) == p.pid]
    exited = [p for p in processes if p.poll() is not None]
    return len(running) == 1 and len(exited) == 1


def test_two_daemons_started_at_once_on_one_state_exactly_one_runs(root: Path) -> None:
    for round_ in range(ROUNDS):
        envs = [session_env(root, f"{round_}a"), session_env(root, f"{round_}b")]
        processes = [start(env) for env in envs]

        wait_for(lambda: settled(processes, envs), 60,  # noqa: B023 - awaited here
                 "one daemon to serve and the other to be refused")
        winner, loser = sorted(zip(processes, envs, strict=True),
                               key=lambda pair: pair[0].poll() is not None)
        assert loser[0].returncode != 0
        said = loser[0].stderr.read() if loser[0].stderr else ""
        assert f"pid {winner[0].pid}" in said, said
        assert socket_of(winner[1]) in said, said
        assert answers(socket_of(loser[1])) is None
        winner[0].terminate()
        assert winner[0].wait(15) == 0
        for process in processes:
            if process.stderr:
                process.stderr.close()


def test_a_second_daemon_for_the_same_state_is_refused_naming_the_first(root: Path) -> None:
    first_env = session_env(root, "one")
    first = start(first_env)
    try:
        wait_for(lambda: answers(socket_of(first_env)) == first.pid, 30, "clusterd to listen")
        second = subprocess.run([sys.executable, "-m", "clusterd"],
                                env=session_env(root, "two"), capture_output=True, text=True,
                                timeout=30)
        assert second.returncode == 1
        assert "refusing to start" in second.stderr
        assert f"pid {first.pid}" in second.stderr
        assert socket_of(first_env) in second.stderr
        assert "hint:" in second.stderr
        # Another state is another daemon: it starts beside the first.
        other_env = session_env(root, "three", state="other-state")
        other = start(other_env)
        wait_for(lambda: answers(socket_of(other_env)) == other.pid, 30, "clusterd to listen")
        other.terminate()
        assert other.wait(15) == 0
    finally:
        first.terminate()
        first.wait(15)


def test_autostart_on_another_socket_names_the_socket_that_serves_the_state(
        root: Path) -> None:
    first_env = session_env(root, "one")
    first = start(first_env)
    try:
        wait_for(lambda: answers(socket_of(first_env)) == first.pid, 30, "clusterd to listen")
        for env, args in (
            ({**first_env, "CLUSTERD_NO_AUTOSTART": ""}, ["--socket", str(root / "o.sock")]),
            ({**session_env(root, "two"), "CLUSTERD_NO_AUTOSTART": ""}, []),
        ):
            env.pop("CLUSTERD_NO_AUTOSTART")
            done = subprocess.run([CLUSTERCTL, *args, "status"], env=env, capture_output=True,
                                  text=True, timeout=60, cwd=root)
            assert done.returncode != 0, done.stdout
            assert socket_of(first_env) in done.stderr, done.stderr
            assert f"pid {first.pid}" in done.stderr
            assert "--socket" in done.stderr
        assert [p.pid for p in daemons_under(root)] == [first.pid]
    finally:
        first.terminate()
        first.wait(15)


def test_daemon_id_is_one_whoever_makes_it_first(root: Path) -> None:
    for round_ in range(20):
        state = root / f"ids-{round_}"
        seen: list[str] = []
        threads = [threading.Thread(target=lambda s=state, out=seen: out.append(daemon_id(s)))
                   for _ in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert len(set(seen)) == 1, seen
        assert (state / "daemon-id").read_text().strip() == seen[0]
        assert sorted(os.listdir(state)) == ["daemon-id"]
