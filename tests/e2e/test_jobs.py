"""Jobs on one shared local cluster, driven through the clusterctl binary as a user would."""

from __future__ import annotations

import getpass
import hashlib
import json
import os
import signal
import sqlite3
import subprocess
import time
from pathlib import Path

import pytest

from clusterd.runtime.ray_node import ray_temp_key
from tests.support import CLUSTERCTL, Daemon, make_git_repo, wait_for

pytestmark = pytest.mark.ray


def queue(daemon: Daemon, cluster: str) -> list[dict[str, object]]:
    result = daemon.ctl("queue", cluster, "--json")
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, object]] = json.loads(result.stdout)
    return jobs


def job_status(daemon: Daemon, cluster: str, job_id: int) -> str:
    return next(str(j["status"]) for j in queue(daemon, cluster) if j["job_id"] == job_id)


def submitted_id(stderr: str) -> int:
    line = next(line for line in stderr.splitlines() if line.startswith("Job ") and
                "submitted" in line)
    return int(line.split()[1])


def test_exec_streams_output_with_skypilot_env(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl(
        "exec", local_cluster, "--env", "GREETING=hello", "--",
        "echo $GREETING rank=$SKYPILOT_NODE_RANK n=$SKYPILOT_NUM_NODES ips=$SKYPILOT_NODE_IPS"
        " task=$SKYPILOT_TASK_ID",
    )
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith("hello rank=0 n=1 ips=127.0.0.1 task=sky-")
    assert line.endswith(f"_{local_cluster}_{submitted_id(result.stderr)}")
    assert "SUCCEEDED" in result.stderr
    info = shared_daemon.ctl("exec", local_cluster, "--",
                             "echo $SKYPILOT_USER; echo \"$SKYPILOT_CLUSTER_INFO\"")
    user, info_json = info.stdout.split("\n", 1)
    assert user == getpass.getuser()
    assert json.loads(info_json) == {"cluster_name": local_cluster, "cloud": "Local",
                                       "region": None, "zone": None, "num_nodes": 1}


def test_failed_job_exits_100_with_the_reason(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl("exec", local_cluster, "--", "echo before; exit 7")
    assert result.returncode == 100
    assert result.stdout == "before\n"
    assert "FAILED" in result.stderr and "exit code 7" in result.stderr


def test_segfault_is_named(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl("exec", local_cluster, "--", "kill -SEGV $$")
    assert result.returncode == 100
    assert "segmentation fault" in result.stderr


def test_detach_then_logs_then_cancel(shared_daemon: Daemon, local_cluster: str,
                                      tmp_path: Path) -> None:
    started = tmp_path / "started"
    result = shared_daemon.ctl("exec", local_cluster, "-d", "--",
                               f"echo first; touch {started}; sleep 300")
    assert result.returncode == 0, result.stderr
    job_id = submitted_id(result.stderr)
    assert f"clusterctl logs {local_cluster} {job_id}" in result.stderr
    wait_for(started.exists, 60, "the job to start")
    snapshot = shared_daemon.ctl("logs", local_cluster, str(job_id), "--no-follow")
    assert snapshot.returncode == 101  # not finished
    assert snapshot.stdout == "first\n"
    follower = shared_daemon.popen_ctl("logs", local_cluster, str(job_id))
    cancel = shared_daemon.ctl("cancel", local_cluster, str(job_id))
    assert cancel.returncode == 0 and f"Cancelled job(s) {job_id}" in cancel.stdout
    out, err = follower.communicate(timeout=60)
    assert follower.returncode == 103, err
    assert out == "first\n"
    assert job_status(shared_daemon, local_cluster, job_id) == "CANCELLED"
    again = shared_daemon.ctl("cancel", local_cluster, str(job_id))
    assert again.returncode == 0 and "already finished" in again.stdout


def test_logs_tail_and_latest_job(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl("exec", local_cluster, "--", "seq 1 500")
    assert result.returncode == 0
    job_id = submitted_id(result.stderr)
    tail = shared_daemon.ctl("logs", local_cluster, str(job_id), "--tail", "3")
    assert tail.returncode == 0 and tail.stdout == "498\n499\n500\n"
    latest = shared_daemon.ctl("logs", local_cluster, "--no-follow", "--tail", "1")
    assert latest.stdout.strip().splitlines()[-1] == "500"


def test_not_found_exits_102(shared_daemon: Daemon, local_cluster: str) -> None:
    for args in (("logs", local_cluster, "999999"), ("queue", "ghost"), ("exec", "ghost", "true"),
                 ("cancel", local_cluster, "999999"), ("logs", "ghost")):
        result = shared_daemon.ctl(*args)
        assert result.returncode == 102, (args, result.stderr)
        assert "hint:" in result.stderr


def test_bad_input_is_a_one_line_error_with_a_hint(shared_daemon: Daemon, local_cluster: str,
                                                   tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("resources:\n  cpus: lots\nrun: echo x\n")
    result = shared_daemon.ctl("exec", local_cluster, str(bad))
    assert result.returncode == 1
    assert f"{bad}: resources.cpus:" in result.stderr
    result = shared_daemon.ctl("exec", local_cluster, str(tmp_path / "missing.yaml"))
    assert result.returncode == 1 and "file not found" in result.stderr
    result = shared_daemon.ctl("launch", "-c", "bad name", "--", "true")
    assert result.returncode == 1 and "INVALID_NAME" in result.stderr
    result = shared_daemon.ctl("exec", local_cluster, "--cpus", "64", "--", "true")
    assert result.returncode == 1 and "64 CPU" in result.stderr


def test_secrets_reach_the_job_and_nowhere_else(shared_daemon: Daemon, local_cluster: str,
                                               tmp_path: Path) -> None:
    """A run with `--secret NAME` (its value from the environment), a `secrets:` block, a git
    token (in `envs`, where it is a secret all the same) and a git workdir; then a run whose
    workdir URL carries credentials. None of the values may show up anywhere but in the job."""
    stamp = str(time.time_ns())
    flag, block, token, in_url = (f"{kind}-{stamp}" for kind in
                                  ("flag0secret", "yaml0secret", "ghp0token", "url0password"))
    secrets = (flag, block, token, in_url)
    digest = hashlib.sha256((flag + block + token).encode()).hexdigest()
    repo = make_git_repo(tmp_path / "repo", "one\n", "two\n")
    task = tmp_path / "task.yaml"
    task.write_text(
        f"workdir:\n  url: file://{repo}\n"
        f"envs:\n  GIT_TOKEN: {token}\n"
        f"secrets:\n  API_KEY: placeholder\n  DB_PASS: {block}\n"
        "run: |\n"
        '  got=$(printf %s "$API_KEY$DB_PASS$GIT_TOKEN" | sha256sum | cut -c1-64)\n'
        f'  [ "$got" = {digest} ] && echo secrets-ok; cat f.txt; sleep 3\n'
    )
    env = {**shared_daemon.env, "API_KEY": flag}
    run = subprocess.Popen([CLUSTERCTL, "exec", local_cluster, "--secret", "API_KEY",
                            str(task)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           text=True, cwd=shared_daemon.root)
    command_lines = ""
    while run.poll() is None:  # what anyone on this machine sees of the running clusterctl
        command_lines += subprocess.run(["ps", "-eww", "-o", "args"], capture_output=True,
                                        text=True).stdout  # -ww: whole lines, never cut
        time.sleep(0.2)
    out, err = run.communicate()
    assert run.returncode == 0, err
    assert out == "secrets-ok\ntwo\n"
    assert "--secret API_KEY" in command_lines  # ps did see clusterctl at work
    outputs = [command_lines, out, err]
    # The same credentials, written into a workdir URL: git fails, and says so without them.
    bad = tmp_path / "bad.yaml"
    bad.write_text(f"workdir:\n  url: https://alice:{in_url}@127.0.0.1:9/r.git\nrun: echo\n")
    failed = shared_daemon.ctl("exec", local_cluster, str(bad))
    assert failed.returncode == 1 and "git fetch failed" in failed.stderr, failed.stderr
    assert "https://<redacted>@127.0.0.1:9/r.git" in failed.stderr
    outputs += [failed.stdout, failed.stderr]
    for args in (("events",), ("events", "--json"), ("status", "--json"), ("status", "-v"),
                 ("requests", "--all", "--json"), ("queue", local_cluster, "--json"),
                 ("logs", local_cluster, "--no-follow")):
        shown = shared_daemon.ctl(*args)
        outputs += [shown.stdout, shown.stderr]
    for text in outputs:
        for secret in secrets:
            assert secret not in text, (secret, text[-2000:])
    cluster = shared_daemon.cluster(local_cluster)
    assert cluster is not None
    places = [shared_daemon.state_dir, shared_daemon.socket.parent,
              Path(shared_daemon.env["XDG_CONFIG_HOME"]),
              # The local agent's runtime (job DB, logs) is under the state dir; Ray's is here.
              Path(f"/tmp/clusterd-ray-{os.getuid()}") / ray_temp_key(cluster["cloud_name"])]
    scanned = 0
    for place in places:
        for path in [place, *place.rglob("*")] if place.exists() else []:
            if path.is_symlink() or not path.is_file():
                continue
            data = path.read_bytes()
            scanned += 1
            for secret in secrets:
                assert secret.encode() not in data, (secret, path)
    assert scanned > 20


def test_job_waits_pending_for_cpus_then_runs(shared_daemon: Daemon, local_cluster: str,
                                              tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    big = shared_daemon.ctl("exec", local_cluster, "-d", "--cpus", "2", "--",
                            f"while [ ! -e {gate} ]; do sleep 0.05; done")
    assert big.returncode == 0, big.stderr
    big_id = submitted_id(big.stderr)
    wait_for(lambda: job_status(shared_daemon, local_cluster, big_id) == "RUNNING", 60,
             "the big job to run")
    small = shared_daemon.ctl("exec", local_cluster, "-d", "--cpus", "1", "--", "echo small")
    small_id = submitted_id(small.stderr)
    assert job_status(shared_daemon, local_cluster, small_id) == "PENDING"
    gate.touch()
    follow = shared_daemon.ctl("logs", local_cluster, str(small_id))
    assert follow.returncode == 0 and follow.stdout == "small\n"
    assert job_status(shared_daemon, local_cluster, big_id) == "SUCCEEDED"


def test_ctrl_c_detaches_and_the_job_goes_on(shared_daemon: Daemon, local_cluster: str,
                                             tmp_path: Path) -> None:
    gate, done = tmp_path / "gate", tmp_path / "done"
    process = shared_daemon.popen_ctl(
        "exec", local_cluster, "--",
        f"echo waiting; while [ ! -e {gate} ]; do sleep 0.05; done; touch {done}",
    )
    assert process.stdout is not None
    assert process.stdout.readline() == "waiting\n"
    process.send_signal(signal.SIGINT)
    _, err = process.communicate(timeout=30)
    assert process.returncode == 101
    assert "re-attach: clusterctl logs" in err
    gate.touch()
    wait_for(done.exists, 60, "the detached job to finish")


def test_killed_client_mid_stream_does_not_kill_the_job(shared_daemon: Daemon,
                                                         local_cluster: str,
                                                         tmp_path: Path) -> None:
    gate, done = tmp_path / "gate", tmp_path / "done"
    process = shared_daemon.popen_ctl(
        "exec", local_cluster, "--",
        f"echo waiting; while [ ! -e {gate} ]; do sleep 0.05; done; touch {done}",
    )
    assert process.stdout is not None and process.stdout.readline() == "waiting\n"
    process.kill()
    process.wait()
    gate.touch()
    wait_for(done.exists, 60, "the orphaned stream's job to finish")
    assert shared_daemon.ctl("status").returncode == 0


def test_yaml_task_with_workdir_mounts_and_envs(shared_daemon: Daemon, local_cluster: str,
                                                tmp_path: Path) -> None:
    work = tmp_path / "project"
    (work / "src").mkdir(parents=True)
    (work / "src" / "main.sh").write_text("echo main ran with $MODE\n")
    (work / ".gitignore").write_text("*.log\n")
    (work / "noise.log").write_text("ignored\n")
    data = tmp_path / "data.txt"
    data.write_text("payload\n")
    mount_target = tmp_path / "mounted" / "data.txt"
    task = tmp_path / "task.yaml"
    task.write_text(
        "name: from-yaml\n"
        f"workdir: {work}\n"
        f"file_mounts:\n  {mount_target}: {data}\n"
        "envs:\n  MODE: yaml\n"
        "run: |\n"
        "  bash src/main.sh\n"
        "  ls\n"
        f"  cat {mount_target}\n"
    )
    result = shared_daemon.ctl("exec", local_cluster, "--env", "MODE=override", str(task))
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "main ran with override"
    assert "src" in lines and "noise.log" not in lines  # .gitignore honoured
    assert lines[-1] == "payload"
    names = [j["name"] for j in queue(shared_daemon, local_cluster)]
    assert "from-yaml" in names


def test_script_longer_than_one_argument(shared_daemon: Daemon, local_cluster: str,
                                         tmp_path: Path) -> None:
    task = tmp_path / "long.yaml"
    filler = "\n".join(f": padding line {i} {'x' * 100}" for i in range(2000))  # ~220 KB
    task.write_text("run: |\n" + "\n".join("  " + line for line in filler.splitlines())
                    + "\n  echo end of a long script\n")
    result = shared_daemon.ctl("exec", local_cluster, str(task))
    assert result.returncode == 0, result.stderr
    assert result.stdout == "end of a long script\n"


def test_queue_and_status_json(shared_daemon: Daemon, local_cluster: str) -> None:
    jobs = queue(shared_daemon, local_cluster)
    assert jobs and {"job_id", "status", "submitted_at", "resources", "log_dir"} <= set(jobs[0])
    assert [j["job_id"] for j in jobs] == sorted((j["job_id"] for j in jobs), reverse=True)
    cluster = shared_daemon.cluster(local_cluster)
    assert cluster is not None and cluster["status"] == "UP" and cluster["infra"] == "local"
    table = shared_daemon.ctl("status")
    assert local_cluster in table.stdout and "UP" in table.stdout
    refreshed = shared_daemon.ctl("status", "--refresh", "--json")
    assert json.loads(refreshed.stdout)[0]["status"] == "UP"


def test_relaunch_with_the_same_config_does_not_reprovision(shared_daemon: Daemon,
                                                            local_cluster: str) -> None:
    def events() -> list[dict[str, object]]:
        out = shared_daemon.ctl("events", local_cluster, "--json").stdout
        result: list[dict[str, object]] = json.loads(out)
        return result

    before = [e for e in events() if e["kind"] == "status"]
    result = shared_daemon.ctl("launch", "-c", local_cluster, "--", "echo again")
    assert result.returncode == 0, result.stderr
    assert result.stdout == "again\n"
    assert "reusing it" in result.stderr
    assert [e for e in events() if e["kind"] == "status"] == before


def test_requests_are_recorded(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl("requests", "--all", "--json")
    recent = json.loads(result.stdout)["recent"]
    assert any(r["op"] == "launch" and r["status"] == "SUCCEEDED" for r in recent)
    db = sqlite3.connect(shared_daemon.state_dir / "state.db")
    try:
        (count,) = db.execute("SELECT COUNT(*) FROM requests WHERE op = 'exec'").fetchone()
    finally:
        db.close()
    assert count >= 1


def test_exec_needs_an_entrypoint(shared_daemon: Daemon, local_cluster: str) -> None:
    result = shared_daemon.ctl("exec", local_cluster)
    assert result.returncode == 1 and "needs a task YAML or a command" in result.stderr


def test_log_lines_carry_the_request_and_the_cluster(shared_daemon: Daemon,
                                                     local_cluster: str) -> None:
    result = shared_daemon.ctl("exec", local_cluster, "--", "echo traced")
    assert result.returncode == 0
    job_id = submitted_id(result.stderr)
    daemon_lines = [json.loads(line) for line in shared_daemon.log().splitlines()
                    if line.startswith("{")]
    submitted = [e for e in daemon_lines if e.get("event") == "job submitted"
                 and e.get("job_id") == job_id]
    assert submitted and submitted[0]["cluster"] == local_cluster
    request_id = submitted[0]["request_id"]
    agent_log = next((shared_daemon.state_dir / "local").glob("*/run/agent.log"))
    agent_lines = [json.loads(line) for line in agent_log.read_text().splitlines()
                   if line.startswith("{")]
    finished = [e for e in agent_lines if e.get("event") == "job finished"
                and e.get("job_id") == job_id]
    assert finished and finished[0]["request_id"] == str(request_id)
    assert finished[0]["cluster"] == local_cluster
