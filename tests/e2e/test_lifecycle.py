"""Cluster lifecycles through clusterctl: launch, stop, start, down, two local clusters side
by side, a daemon killed and restarted, and requests blocked by (and pre-empted by) others."""

from __future__ import annotations

import json
import os
import signal
import sqlite3
from pathlib import Path

import pytest

from tests.support import Daemon, pid_alive, ray_processes_of, read_until, wait_for

pytestmark = pytest.mark.ray


def runtime_dir(daemon: Daemon, name: str) -> Path:
    cluster = daemon.cluster(name)
    assert cluster is not None
    return daemon.state_dir / "local" / str(cluster["cloud_name"])


def status_events(daemon: Daemon, name: str) -> list[tuple[str, str]]:
    events = json.loads(daemon.ctl("events", name, "--json").stdout)
    return [(e["from_status"], e["to_status"]) for e in events if e["kind"] == "status"]


def test_launch_stop_start_down(daemon: Daemon, tmp_path: Path) -> None:
    task = tmp_path / "task.yaml"
    task.write_text(
        "name: life\n"
        "resources:\n  infra: local\n  cpus: 1\n"
        "setup: echo setting up on $SKYPILOT_SETUP_NODE_RANK\n"
        "run: echo running on $SKYPILOT_NODE_RANK\n"
    )
    launch = daemon.ctl("launch", "-c", "life", "-i", "30", str(task))
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    assert launch.stdout == "setting up on 0\nrunning on 0\n"
    for phase in ("starting Ray", "starting the agent", "cluster life is UP"):
        assert phase in launch.stderr
    cluster = daemon.cluster("life")
    assert cluster is not None and cluster["status"] == "UP"
    assert cluster["autostop_minutes"] == 30
    run_dir = runtime_dir(daemon, "life")
    pids = ray_processes_of(run_dir)
    assert len(pids) == 2  # Ray and the agent

    stop = daemon.ctl("stop", "-y", "life")
    assert stop.returncode == 0 and "Cluster life stopped." in stop.stdout
    assert daemon.cluster("life")["status"] == "STOPPED"  # type: ignore[index]
    assert not any(pid_alive(p) for p in pids)
    refused = daemon.ctl("exec", "life", "--", "true")
    assert refused.returncode == 1
    assert "is STOPPED" in refused.stderr and "clusterctl start life" in refused.stderr
    again = daemon.ctl("stop", "-y", "life")
    assert again.returncode == 0 and "already stopped" in again.stdout

    # `launch -c NAME` without a task (as `sky launch -c NAME`) brings it up, runs nothing.
    relaunch = daemon.ctl("launch", "-c", "life")
    assert relaunch.returncode == 0, relaunch.stderr
    assert "Cluster life is ready" in relaunch.stderr
    assert daemon.cluster("life")["status"] == "UP"  # type: ignore[index]
    assert daemon.ctl("stop", "-y", "life").returncode == 0
    nothing = daemon.ctl("launch", "-c", "nosuch")
    assert nothing.returncode == 1 and "INVALID_ARGUMENT" in nothing.stderr
    assert "launch needs a task" in nothing.stderr and "-- CMD" in nothing.stderr
    assert daemon.cluster("nosuch") is None

    start = daemon.ctl("start", "-v", "life")
    assert start.returncode == 0, start.stderr
    assert "[life] [" in start.stderr and "ray        starting Ray on 1 node(s)" in start.stderr
    (summary,) = [line for line in start.stderr.splitlines() if "phases: " in line]
    assert summary.startswith("[life] phases: start ") and ", ray " in summary, summary
    assert daemon.cluster("life")["status"] == "UP"  # type: ignore[index]
    exec_ = daemon.ctl("exec", "life", "--", "echo back")
    assert exec_.returncode == 0 and exec_.stdout == "back\n"
    # Jobs survive a stop/start in the queue (the agent's database stays on the node).
    assert len(json.loads(daemon.ctl("queue", "life", "--json").stdout)) == 2

    pids = ray_processes_of(run_dir)
    down = daemon.ctl("down", "-y", "life")
    assert down.returncode == 0 and "Cluster life torn down." in down.stdout
    assert daemon.cluster("life") is None
    assert not run_dir.exists()
    assert not list((daemon.socket.parent / "agents").iterdir())  # the agent's socket too
    assert not any(pid_alive(p) for p in pids)
    assert status_events(daemon, "life") == [
        (None, "INIT"), ("INIT", "UP"), ("UP", "STOPPED"), ("STOPPED", "UP"),
        ("UP", "STOPPED"), ("STOPPED", "UP"), ("UP", "TERMINATED"),
    ]
    gone = daemon.ctl("down", "-y", "life")
    assert gone.returncode == 102


def test_two_local_clusters_side_by_side(daemon: Daemon) -> None:
    launches = [daemon.popen_ctl("launch", "-c", name, "--", f"echo I am {name}")
                for name in ("left", "right")]
    for process, name in zip(launches, ("left", "right"), strict=True):
        out, err = process.communicate(timeout=240)
        assert process.returncode == 0, err + daemon.log()[-3000:]
        assert out == f"I am {name}\n"
    left, right = runtime_dir(daemon, "left"), runtime_dir(daemon, "right")
    assert set(ray_processes_of(left)).isdisjoint(ray_processes_of(right))
    for name in ("left", "right"):
        result = daemon.ctl("exec", name, "--", "echo $SKYPILOT_TASK_ID")
        assert result.returncode == 0 and f"_{name}_2" in result.stdout
    down = daemon.ctl("down", "-y", "left")
    assert down.returncode == 0
    still = daemon.ctl("exec", "right", "--", "echo still here")
    assert still.returncode == 0 and still.stdout == "still here\n"


def test_daemon_killed_and_restarted_keeps_everything(daemon: Daemon) -> None:
    launch = daemon.ctl("launch", "-c", "phoenix", "--", "echo one")
    assert launch.returncode == 0, launch.stderr
    daemon.kill()  # SIGKILL: no chance to clean up
    daemon.start()
    cluster = daemon.cluster("phoenix")
    assert cluster is not None and cluster["status"] == "UP"
    result = daemon.ctl("exec", "phoenix", "--", "echo two")
    assert result.returncode == 0 and result.stdout == "two\n"
    queued = json.loads(daemon.ctl("queue", "phoenix", "--json").stdout)
    assert [j["status"] for j in queued] == ["SUCCEEDED", "SUCCEEDED"]


def test_blocked_request_says_by_what_and_down_preempts_a_queued_launch(daemon: Daemon) -> None:
    first = daemon.popen_ctl("launch", "-c", "busy", "--", "echo first")
    wait_for(lambda: any(r["op"] == "launch" for r in
                         json.loads(daemon.ctl("requests", "--json").stdout)["running"]),
             30, "the first launch to start")
    running = json.loads(daemon.ctl("requests", "--json").stdout)["running"]
    first_id = next(r["id"] for r in running if r["op"] == "launch")
    second = daemon.popen_ctl("launch", "-c", "busy", "--", "echo second")
    line = read_until(second, "waiting:", 15)
    assert f"blocked by request {first_id} (launch)" in line
    down = daemon.popen_ctl("down", "-y", "busy")
    _, second_err = second.communicate(timeout=60)
    assert second.returncode == 1
    assert "PREEMPTED" in second_err and "(down)" in second_err
    _, first_err = first.communicate(timeout=240)
    _, down_err = down.communicate(timeout=240)
    assert down.returncode == 0, down_err
    # The down calls the first launch off if it is still launching (1, saying so), or cuts its
    # job short (103), or tears the cluster down before its log could be followed (102,
    # saying so); or the job was quick enough to finish (0).
    assert first.returncode in (0, 1, 102, 103), first_err
    if first.returncode == 1:
        assert "[PREEMPTED]" in first_err and "called off by request" in first_err
    if first.returncode == 102:
        assert "was torn down while its job 1 was followed" in first_err
    assert daemon.cluster("busy") is None


def test_lock_wait_is_bounded(daemon: Daemon) -> None:
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_LOCK_TIMEOUT": "2"})
    first = daemon.popen_ctl("launch", "-c", "slow", "--", "echo first")
    # The first launch holds the lock for as long as its Ray start is stopped (a launch takes
    # less than the lock's timeout now).
    found: dict[str, Path] = {}

    def ray_spawned() -> bool:
        cluster = daemon.cluster("slow")
        if cluster is not None and cluster.get("cloud_name"):
            found["pid"] = runtime_dir(daemon, "slow") / "run" / "ray.pid"
        return "pid" in found and found["pid"].exists()

    wait_for(ray_spawned, 60, "the first launch to start Ray")
    group = os.getpgid(json.loads(found["pid"].read_text())["pid"])
    os.killpg(group, signal.SIGSTOP)
    try:
        second = daemon.ctl("launch", "-c", "slow", "--", "echo second", timeout=60)
    finally:
        os.killpg(group, signal.SIGCONT)
    assert second.returncode == 1
    assert "LOCK_TIMEOUT" in second.stderr and "blocked by request" in second.stderr
    _, err = first.communicate(timeout=240)
    assert first.returncode == 0, err


def test_failed_launch_leaves_no_record_and_no_process(daemon: Daemon) -> None:
    too_big = daemon.ctl("launch", "-c", "toobig", "--cpus", "512", "--", "true")
    assert too_big.returncode == 1 and "512 CPUs" in too_big.stderr
    assert daemon.cluster("toobig") is None
    # Now a launch that fails after its record exists: Ray refuses a 1 MB object store.
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_LOCAL_OBJECT_STORE_BYTES": str(1024 * 1024)})
    result = daemon.ctl("launch", "-c", "doomed", "--", "true")
    assert result.returncode == 1
    assert "Ray head exited while" in result.stderr, result.stderr
    assert daemon.cluster("doomed") is None
    events = json.loads(daemon.ctl("events", "doomed", "--json").stdout)
    assert [e["to_status"] for e in events] == ["INIT", "TERMINATED"]
    assert events[-1]["reason"].startswith("launch failed:")
    local = daemon.state_dir / "local"
    assert not local.exists() or not any(local.iterdir())


def test_an_agent_started_by_an_older_clusterd_is_refused_then_replaced(daemon: Daemon
                                                                        ) -> None:
    """Runtimes recorded before agents had a token (and on remote heads a TCP port): the daemon
    will not talk to such an agent; it says so, and a launch replaces it."""
    assert daemon.ctl("launch", "-c", "old", "--", "echo first").returncode == 0
    daemon.stop()
    db = sqlite3.connect(daemon.state_dir / "state.db")
    try:
        (raw,) = db.execute("SELECT handle FROM clusters WHERE name = 'old'").fetchone()
        handle = json.loads(raw)
        runtime = handle["runtime"]
        assert runtime.pop("agent_token") and runtime.pop("agent_socket")
        runtime["agent_port"] = 12345  # as an older daemon recorded it
        db.execute("UPDATE clusters SET handle = ? WHERE name = 'old'", [json.dumps(handle)])
        db.commit()
    finally:
        db.close()
    daemon.start()
    assert daemon.ctl("status", "--refresh", "old").returncode == 0
    cluster = daemon.cluster("old")
    assert cluster is not None and cluster["status"] == "INIT"
    assert "started by an older clusterd" in cluster["status_reason"]
    refused = daemon.ctl("exec", "old", "--", "true")
    assert refused.returncode == 1 and "started by an older clusterd" in refused.stderr
    assert "clusterctl launch -c old" in refused.stderr
    repaired = daemon.ctl("launch", "-c", "old", "--", "echo repaired")
    assert repaired.returncode == 0, repaired.stderr
    assert "upgrading the runtime" in repaired.stderr and repaired.stdout == "repaired\n"
    assert daemon.ctl("exec", "old", "--", "echo ok").stdout == "ok\n"
