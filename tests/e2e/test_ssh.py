"""SSH node pools end to end, on the test bed: three real sshd hosts on 127.0.0.2-4, one Linux
user each, a real two-node Ray cluster across two of them, driven through clusterctl."""

from __future__ import annotations

import hashlib
import json
import os
import pwd
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterd.nodes import SSHTarget
from tests.e2e.sshbed import (
    GRPC_PROBE,
    PREFIX,
    PROBE,
    RAY_DRIVER,
    Bed,
    free_port,
    port_open,
    restart_agent,
    ssh_bed,
)
from tests.support import autostop_pass_after, make_git_repo, other_user, pid_alive, wait_for

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed() as made:
        yield made


@pytest.fixture(scope="module")
def duo(bed: Bed) -> str:
    result = bed.daemon.ctl("launch", "-v", "-c", "duo", "--infra", "ssh/testbed",
                            "--num-nodes", "2", "--", "echo launched on $SKYPILOT_NODE_RANK",
                            timeout=900)
    assert result.returncode == 0, result.stderr + bed.daemon.log()[-5000:]
    for phase in ("install    preparing the runtime", "install    installing the runtime",
                  "ray        starting Ray on 2",
                  "agent      starting the agent", "up         cluster duo is UP"):
        assert phase in result.stderr, phase
    # -v: where the launch's time went, each phase once, in order, before the job's result.
    (summary,) = [line for line in result.stderr.splitlines() if line.startswith("phases: ")]
    timed = [part.split()[0] for part in summary.removeprefix("phases: ").split(", ")]
    assert timed == ["placement", "provision", "install", "ray", "agent", "up"], summary
    assert sorted(result.stdout.splitlines()) == ["(head, rank=0) launched on 0",
                                                  "(worker1, rank=1) launched on 1"]
    # The head's runtime was sent first; the worker's once it had arrived.
    events = [(e["event"], e.get("node"), e.get("head")) for e in
              map(json.loads, filter(lambda line: line.startswith("{"),
                                     bed.daemon.log().splitlines()))
              if e.get("cluster") == "duo"
              and e["event"] in ("runtime install begins", "runtime installed")]
    (head,) = [node for event, node, is_head in events if is_head]
    assert [(event, node == head) for event, node, _ in events] == [
        ("runtime install begins", True), ("runtime installed", True),
        ("runtime install begins", False), ("runtime installed", False)], events
    return "duo"


def ctl(bed: Bed, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return bed.daemon.ctl(*args, timeout=timeout)


def submitted(stderr: str) -> int:
    line = next(line for line in stderr.splitlines() if "submitted" in line)
    return int(line.split()[1])


def test_check_lists_the_pool(bed: Bed) -> None:
    result = ctl(bed, "check", "--json")
    assert result.returncode == 0, result.stderr
    hosts = json.loads(result.stdout)["hosts"]
    assert [(h["host"], h["user"], h["ok"]) for h in hosts] == [
        (h["ip"], h["user"], True) for h in bed.hosts]
    # First contact: each key is pinned, and shown with its fingerprint.
    assert all(h["new_host_key"] and h["host_key"].startswith("ssh-ed25519 SHA256:")
               for h in hosts)
    table = ctl(bed, "check")
    assert "testbed" in table.stdout and "free" in table.stdout
    assert "(new: pinned now)" not in table.stdout  # pinned by the first check


def test_jobs_run_on_both_nodes_as_their_users(bed: Bed, duo: str) -> None:
    result = ctl(bed, "exec", duo, "--num-nodes", "2", "--",
                 "echo rank=$SKYPILOT_NODE_RANK user=$(whoami) "
                 "n=$SKYPILOT_NUM_NODES ips=$(echo $SKYPILOT_NODE_IPS) pwd=$(pwd)")
    assert result.returncode == 0, result.stderr
    ips = " ".join(h["ip"] for h in bed.hosts[:2])
    assert sorted(result.stdout.splitlines()) == [
        f"(head, rank=0) rank=0 user={PREFIX}1 n=2 ips={ips} pwd=/home/{PREFIX}1/sky_workdir",
        f"(worker1, rank=1) rank=1 user={PREFIX}2 n=2 ips={ips} pwd=/home/{PREFIX}2/sky_workdir",
    ]


def test_hosts_are_not_shared_between_clusters(bed: Bed, duo: str) -> None:
    result = ctl(bed, "launch", "-c", "greedy", "--infra", "ssh/testbed", "--num-nodes", "2",
                 "--", "true")
    assert result.returncode == 1
    assert "pool testbed has 1 free host(s) of 3; the task needs 2" in result.stderr
    assert "in use by: duo" in result.stderr
    assert bed.daemon.cluster("greedy") is None
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert [h["cluster"] for h in check] == ["duo", "duo", None]


def test_stop_is_refused_on_hosts_we_do_not_own(bed: Bed, duo: str) -> None:
    result = ctl(bed, "stop", "-y", duo)
    assert result.returncode == 1
    assert "cannot be stopped" in result.stderr and f"clusterctl down {duo}" in result.stderr
    result = ctl(bed, "launch", "-c", duo, "-i", "5", "--", "true")
    assert result.returncode == 1 and "autostop needs --down" in result.stderr


def test_failure_on_one_node_kills_the_other(bed: Bed, duo: str) -> None:
    marker = f"/tmp/{PREFIX}-fail-$SKYPILOT_NODE_RANK"
    result = ctl(bed, "exec", duo, "--num-nodes", "2", "--",
                 f"if [ $SKYPILOT_NODE_RANK = 1 ]; then exit 3; fi; "
                 f"sleep 300 & echo $! > {marker}; wait")
    assert result.returncode == 100
    assert f"rank 1 ({bed.hosts[1]['ip']}) exited with exit code 3" in result.stderr
    child = Path(f"/tmp/{PREFIX}-fail-0")
    if child.exists():
        pid = int(child.read_text())
        child.unlink()
        assert not pid_alive(pid)


def test_setup_failure_names_the_failed_nodes(bed: Bed, duo: str, tmp_path: Path) -> None:
    task = tmp_path / "setup.yaml"
    task.write_text("num_nodes: 2\nsetup: |\n  if [ $SKYPILOT_SETUP_NODE_RANK = 1 ]; then "
                    "exit 4; fi\nrun: echo never\n")
    result = ctl(bed, "launch", "-c", duo, str(task))
    assert result.returncode == 100
    assert "FAILED_SETUP" in result.stderr
    assert f"setup failed on rank 1 ({bed.hosts[1]['ip']}) exited with exit code 4" in \
        result.stderr


def test_cancel_kills_processes_on_both_nodes(bed: Bed, duo: str) -> None:
    result = ctl(bed, "exec", duo, "-d", "--num-nodes", "2", "--",
                 f"sleep 300 & echo $! > /tmp/{PREFIX}-cancel-$SKYPILOT_NODE_RANK; wait")
    job = submitted(result.stderr)
    files = [Path(f"/tmp/{PREFIX}-cancel-{rank}") for rank in (0, 1)]
    wait_for(lambda: all(f.exists() and f.read_text().strip() for f in files), 60,
             "both ranks to start")
    pids = [int(f.read_text()) for f in files]
    assert all(pid_alive(p) for p in pids)
    assert ctl(bed, "cancel", duo, str(job)).returncode == 0
    wait_for(lambda: not any(pid_alive(p) for p in pids), 30, "the sleeps to die")
    assert "CANCELLED" in ctl(bed, "logs", duo, str(job), "--no-follow").stderr
    for f in files:
        f.unlink()


def test_workdir_file_mounts_and_ignore_files(bed: Bed, duo: str, tmp_path: Path) -> None:
    work = tmp_path / "proj"
    (work / "keep").mkdir(parents=True)
    (work / "keep" / "a.txt").write_text("kept\n")
    (work / "big.bin").write_text("x" * 1000)
    (work / ".gitignore").write_text("*.txt\n")  # overridden by .skyignore below
    (work / ".skyignore").write_text("*.bin\n")
    mount = tmp_path / "mount.txt"
    mount.write_text("mounted\n")
    task = tmp_path / "files.yaml"
    task.write_text(
        f"num_nodes: 2\nworkdir: {work}\nfile_mounts:\n  ~/data/m.txt: {mount}\n"
        "run: |\n  cat keep/a.txt; ls; cat ~/data/m.txt\n"
    )
    result = ctl(bed, "exec", duo, str(task))
    assert result.returncode == 0, result.stderr
    for label in ("(head, rank=0)", "(worker1, rank=1)"):
        lines = [line.removeprefix(label + " ") for line in result.stdout.splitlines()
                 if line.startswith(label)]
        assert lines[0] == "kept"
        assert "big.bin" not in lines and "keep" in lines
        assert lines[-1] == "mounted"


def test_git_workdir_is_cloned_on_every_node(bed: Bed, duo: str, tmp_path: Path) -> None:
    repo = tmp_path / "served" / "app.git"
    work = make_git_repo(tmp_path / "work", "echo hello from git\n", "echo second version\n",
                         name="hello.sh")
    subprocess.run(["git", "clone", "-q", "--bare", str(work), str(repo)], check=True)
    # A real git server on loopback, as the nodes would reach a remote one.
    port = free_port()
    server = subprocess.Popen(["git", "daemon", "--export-all", "--reuseaddr",
                               f"--base-path={repo.parent}", "--listen=127.0.0.1",
                               f"--port={port}", str(repo.parent)],
                              stderr=subprocess.DEVNULL)
    task = tmp_path / "git.yaml"
    task.write_text(f"num_nodes: 2\nworkdir:\n  url: git://127.0.0.1:{port}/app.git\n"
                    "  ref: v1\nrun: bash hello.sh\n")
    try:
        wait_for(lambda: port_open(port), 10, "git daemon")
        result = ctl(bed, "exec", duo, str(task))
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.splitlines()) == ["(head, rank=0) hello from git",
                                                      "(worker1, rank=1) hello from git"]
        # The default ref is the repository's HEAD.
        task.write_text(f"num_nodes: 2\nworkdir:\n  url: git://127.0.0.1:{port}/app.git\n"
                        "run: bash hello.sh\n")
        result = ctl(bed, "exec", duo, str(task))
        assert result.returncode == 0, result.stderr
        assert sorted(result.stdout.splitlines()) == ["(head, rank=0) second version",
                                                      "(worker1, rank=1) second version"]
    finally:
        server.terminate()
        server.wait(10)


def test_fifty_concurrent_execs_all_succeed(bed: Bed, duo: str) -> None:
    processes = [bed.daemon.popen_ctl("exec", duo, "--num-nodes", "1", "--", f"echo n{i}")
                 for i in range(50)]
    for i, process in enumerate(processes):
        out, err = process.communicate(timeout=600)
        assert process.returncode == 0, err
        assert out == f"n{i}\n"


def test_log_stream_survives_a_killed_ssh_connection(bed: Bed, duo: str) -> None:
    result = ctl(bed, "exec", duo, "-d", "--num-nodes", "1", "--",
                 "for i in $(seq 1 40); do echo line $i; sleep 0.1; done")
    job = submitted(result.stderr)
    follower = bed.daemon.popen_ctl("logs", duo, str(job))
    assert follower.stdout is not None
    assert follower.stdout.readline() == "line 1\n"
    # Kill the sshd process serving the daemon's connection to the head.
    sessions = subprocess.run(["pgrep", "-f", f"^sshd: {PREFIX}1 \\[priv\\]"],
                              capture_output=True, text=True).stdout.split()
    assert sessions, "no sshd session for the head's connection"
    for pid in sessions:
        os.kill(int(pid), signal.SIGTERM)
    # Not communicate(): it reads the pipe, not what readline already buffered (line 2 may
    # have come with line 1).
    rest = follower.stdout.read()
    assert follower.stderr is not None
    err = follower.stderr.read()
    follower.wait(120)
    assert follower.returncode == 0, err
    assert ("line 1\n" + rest).splitlines() == [f"line {i}" for i in range(1, 41)]


def test_tunnel_is_a_private_unix_socket(bed: Bed, duo: str) -> None:
    cluster = bed.daemon.cluster(duo)
    assert cluster is not None and cluster["tunnel"] is not None
    socket_path = Path(cluster["tunnel"]["socket"])
    assert socket_path.stat().st_mode & 0o777 == 0o600
    assert socket_path.parent.stat().st_mode & 0o777 == 0o700
    verbose = ctl(bed, "status", "-v")
    assert str(socket_path) in verbose.stdout
    # No TCP listener of the daemon's on this machine.
    assert bed.daemon.process is not None
    listening = subprocess.run(["ss", "-ltnpH"], capture_output=True, text=True).stdout
    assert f"pid={bed.daemon.process.pid}," not in listening


def test_another_user_of_the_head_cannot_reach_the_agent_or_run_jobs(bed: Bed, duo: str
                                                                    ) -> None:
    cloud_name, runtime = bed.runtime(duo)
    head_user = pwd.getpwnam(f"{PREFIX}1")
    home = Path(head_user.pw_dir)
    base = home / ".clusterd" / "clusters" / cloud_name
    agent_pid = json.loads((base / "run" / "agent.pid").read_text())["pid"]

    def listening(flags: str, column: int) -> list[str]:
        lines = subprocess.run(["ss", flags], capture_output=True, text=True).stdout
        return [line.split()[column] for line in lines.splitlines()
                if f"pid={agent_pid}," in line]

    # The agent's API is on one Unix socket; TCP ports in its process are Ray's (a driver's).
    assert listening("-lxpH", 4) == [runtime["agent_socket"]]
    agent_tcp = [int(address.rsplit(":", 1)[1]) for address in listening("-ltnpH", 3)]
    jobs_before = json.loads(ctl(bed, "queue", duo, "--json").stdout)
    spec = {
        "sockets": [runtime["agent_socket"]],
        "files": [str(base / "run" / "agent.token"), str(base / "ray_token"),
                  str(base / "agent" / "jobs.db")],
        "dirs": [str(Path(runtime["agent_socket"]).parent), str(base),
                 f"/tmp/clusterd-ray-{head_user.pw_uid}"],
        "python": str(home / ".clusterd" / "current" / "bin" / "python"),
        "host": bed.hosts[0]["ip"],
        "tcp": sorted({*agent_tcp, *runtime["ports"].values()}),
        "ray_address": runtime["ray_address"],
        "grpc": GRPC_PROBE,
        "ray": RAY_DRIVER,
    }
    with other_user("cda") as attacker:
        probe = attacker.run(["/usr/bin/python3", "-c", PROBE, json.dumps(spec)], timeout=400)
        assert probe.returncode == 0, probe.stderr
        found = json.loads(probe.stdout)
    for path in [*spec["sockets"], *spec["files"], *spec["dirs"]]:
        assert found[path] == "EACCES", (path, found[path])
    code, out, err = found["grpc"]
    assert code == 0, err
    calls = json.loads(out)
    assert calls and "OK" not in calls.values(), calls
    code, out, err = found["ray"]
    assert code != 0 and "RAN AS" not in out, (out, err)
    assert "AuthenticationError" in err, err  # Ray's token, not a broken probe, stopped it
    assert json.loads(ctl(bed, "queue", duo, "--json").stdout) == jobs_before


def test_ssh_cluster_by_name(bed: Bed, duo: str) -> None:
    config = Path(bed.daemon.env["HOME"]) / ".ssh" / "config"
    for alias, user in ((duo, f"{PREFIX}1"), (f"{duo}-worker1", f"{PREFIX}2")):
        result = subprocess.run(["ssh", "-F", str(config), "-o", "BatchMode=yes", alias,
                                 "whoami"], capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        assert result.stdout.strip() == user


def test_relaunch_skips_the_installed_runtime(bed: Bed, duo: str) -> None:
    def installs() -> int:
        return bed.daemon.log().count('"event": "runtime installed"')

    before = installs()
    result = ctl(bed, "launch", "-c", "solo", "--infra", "ssh/testbed", "--", "echo solo")
    assert result.returncode == 0, result.stderr
    assert installs() == before + 1  # the third host was new
    down = ctl(bed, "down", "-y", "solo")
    assert down.returncode == 0
    again = ctl(bed, "launch", "-c", "solo", "--infra", "ssh/testbed", "--", "echo again")
    assert again.returncode == 0 and again.stdout == "again\n"
    assert installs() == before + 1  # same version: nothing installed again
    assert ctl(bed, "down", "-y", "solo").returncode == 0


def test_agent_of_another_version_is_detected_and_upgraded(bed: Bed, duo: str) -> None:
    version_file = subprocess.run(
        ["bash", "-c", f"ls /home/{PREFIX}1/.clusterd/current/lib/python3*/site-packages/"
                       "clusterctl/_version.py"], capture_output=True, text=True,
    ).stdout.strip()
    original = Path(version_file).read_text()
    Path(version_file).write_text('__version__ = "0.0.1"\n')
    try:
        restart_agent(bed, duo)
        # A refresh that came by while the agent was restarting may have marked the cluster INIT
        # for "not answering"; this one finds the other version, as an exec would.
        assert ctl(bed, "status", "--refresh", duo).returncode == 0
        cluster = bed.daemon.cluster(duo)
        assert cluster is not None and cluster["status"] == "INIT"
        assert "clusterd 0.0.1" in cluster["status_reason"], cluster["status_reason"]
        refused = ctl(bed, "exec", duo, "--", "true")
        assert refused.returncode == 1
        assert "runs clusterd 0.0.1" in refused.stderr
        assert f"clusterctl launch -c {duo}" in refused.stderr
        relaunch = ctl(bed, "launch", "-c", duo, "--", "echo upgraded")
        assert relaunch.returncode == 0, relaunch.stderr
        assert "upgrading the runtime" in relaunch.stderr
        assert "0.0.1" not in Path(version_file).read_text()
        assert ctl(bed, "exec", duo, "--num-nodes", "1", "--", "echo ok").stdout == "ok\n"
    finally:  # never leave the host's runtime claiming another version to later tests
        if "0.0.1" in Path(version_file).read_text():
            Path(version_file).write_text(original)


# Lists, as JSON, what the job finds where the task's files went (TMP is filled in).
LIST_PATHS = """python3 - <<'EOF'
import json, os
def tree(top):
    return sorted(os.path.relpath(os.path.join(d, n), top)
                  for d, dirs, files in os.walk(top) for n in dirs + files)
home = os.path.expanduser("~")
print(json.dumps({
    "workdir": tree("."), "tmp": tree(TMP), "home": sorted(os.listdir(home)),
    "quoted": tree(os.path.join(home, 'a"b')), "rel": tree(os.path.join(home, "rel dir")),
    "mounted": open(os.path.join(home, "it's $HOME;ok")).read(),
}))
EOF
"""


def test_paths_with_spaces_and_shell_characters_keep_their_names(
        bed: Bed, tmp_path: Path) -> None:
    """Workdir and file mount sources and targets whose names hold spaces and shell
    characters arrive (by rsync, through the daemon's connection) under exactly those
    names: no escaping left in them, nothing run by a shell."""
    odd = "it's $HOME; a&b `x` (y) \\z *"
    work = tmp_path / f"work dir {odd}"
    (work / "sub dir").mkdir(parents=True)
    (work / "sub dir" / f'{odd} "q".txt').write_text("w\n")
    (work / "plain.txt").write_text("p\n")
    source_file = tmp_path / f"src {odd}.txt"
    source_file.write_text("mounted\n")
    source_dir = tmp_path / f'dir "src" {odd}'
    (source_dir / "in ner").mkdir(parents=True)
    (source_dir / "in ner" / "f;g").write_text("d\n")
    tmp = f"/tmp/{PREFIX}-{os.urandom(3).hex()} dir with space"
    mounts = {f"{tmp}/x": str(source_file), "~/it's $HOME;ok": str(source_file),
              '~/a"b': str(source_dir), "rel dir/back\\slash *star": str(source_file)}
    task = tmp_path / "paths.yaml"  # JSON is YAML, and needs no quoting by hand here
    task.write_text(json.dumps({"workdir": str(work), "file_mounts": mounts,
                                "run": LIST_PATHS.replace("TMP", json.dumps(tmp))}))
    expected = {
        "workdir": sorted(["plain.txt", "sub dir", f'sub dir/{odd} "q".txt']),
        "tmp": ["x"], "quoted": ["in ner", "in ner/f;g"], "rel": ["back\\slash *star"],
        "mounted": "mounted\n",
    }
    try:
        for verb in (("launch", "-c", "paths", "--infra", "ssh/testbed"), ("exec", "paths")):
            result = ctl(bed, *verb, str(task))
            assert result.returncode == 0, result.stderr + bed.daemon.log()[-3000:]
            found = json.loads(result.stdout)
            assert {k: found[k] for k in expected} == expected, verb
            assert {"sky_workdir", "it's $HOME;ok", 'a"b', "rel dir"} <= set(found["home"])
            assert not any("\\" in name for name in found["home"]), found["home"]
    finally:
        ctl(bed, "down", "-y", "paths")
        subprocess.run(["rm", "-rf", "--", tmp], check=False)


def test_down_returns_the_hosts_and_cleans_them(bed: Bed, duo: str) -> None:
    cluster = bed.daemon.cluster(duo)
    assert cluster is not None
    tunnel = Path(cluster["tunnel"]["socket"])
    result = ctl(bed, "down", "-y", duo)
    assert result.returncode == 0, result.stderr
    assert bed.daemon.cluster(duo) is None
    assert not tunnel.exists()
    for index in (0, 1):
        listing = bed.ssh(index, "ls ~/.clusterd/clusters/ 2>/dev/null | wc -l")
        assert listing.stdout.strip() == "0"
        wait_for(lambda i=index: not bed.user_pids(i), 30, "the node's processes to go")
    assert not (Path(bed.daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "ssh" / duo).exists()
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert [h["cluster"] for h in check] == [None, None, None]


def test_agent_tears_down_its_ssh_cluster_when_no_daemon_comes(bed: Bed) -> None:
    daemon = bed.daemon
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_AGENT_AUTOSTOP_GRACE": "2",
                            "CLUSTERD_AUTOSTOP_CHECK": "3600"})  # the daemon never fires
    result = ctl(bed, "launch", "-c", "lonely", "--infra", "ssh/testbed", "--num-nodes", "2",
                 "-i", "0.02", "--down", "--", "true")
    assert result.returncode == 0, result.stderr
    assert bed.user_pids(0) and bed.user_pids(1)
    daemon.kill()
    # The agent stops Ray on the worker (through a Ray task there), then on the head, then
    # itself: nothing of the cluster's is left running on either host.
    wait_for(lambda: not bed.user_pids(0) and not bed.user_pids(1), 90,
             "the agent to stop the whole cluster")
    daemon.start(extra_env={"CLUSTERD_REFRESH_INTERVAL": "1"})
    wait_for(lambda: daemon.cluster("lonely") is None, 60, "the daemon to settle it")
    events = json.loads(ctl(bed, "events", "lonely", "--json").stdout)
    assert events[-1]["to_status"] == "TERMINATED"
    assert events[-1]["reason"].startswith("autostop by the agent")
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert [h["cluster"] for h in check] == [None, None, None]


def test_an_open_ssh_session_keeps_the_cluster_from_autostopping(bed: Bed) -> None:
    daemon = bed.daemon
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_AUTOSTOP_CHECK": "1"})
    result = ctl(bed, "launch", "-c", "watch", "--infra", "ssh/testbed", "--", "true")
    assert result.returncode == 0, result.stderr
    config = Path(daemon.env["HOME"]) / ".ssh" / "config"
    # An interactive login (with a terminal) to the head, as a person would have.
    session = subprocess.Popen(["ssh", "-F", str(config), "-tt", "watch", "sleep 300"],
                               stdin=subprocess.PIPE, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        wait_for(lambda: subprocess.run(["pgrep", "-f", f"^sshd: {PREFIX}1@pts/"],
                                        capture_output=True).returncode == 0, 30,
                 "the session to be up")
        set_at = time.time()
        assert ctl(bed, "autostop", "watch", "-i", "0.02", "--down").returncode == 0
        # The agent samples sessions every 5 s; were the session not counted, 1.2 s of
        # idleness would do: a pass that began after both has seen the cluster busy.
        later = wait_for(lambda: autostop_pass_after(daemon, set_at + 5 + 1.2), 30,
                         "an autostop pass past the deadline")
        assert "watch" in later.checked
        cluster = daemon.cluster("watch")
        assert cluster is not None and cluster["autostop_deadline"] is None  # busy
    finally:
        session.kill()
        session.wait()
    # Another user's process that merely calls itself a session of the cluster's user must
    # not keep the cluster up.
    with other_user("cds") as attacker:
        fake = subprocess.Popen(
            ["setpriv", f"--reuid={attacker.uid}", f"--regid={attacker.gid}", "--init-groups",
             "bash", "-c", f"exec -a 'sshd: {PREFIX}1@pts/9' sleep 300"])
        try:
            wait_for(lambda: subprocess.run(["pgrep", "-u", attacker.name, "-f",
                                             f"^sshd: {PREFIX}1@pts/9"],
                                            capture_output=True).returncode == 0, 10,
                     "the fake session")
            wait_for(lambda: daemon.cluster("watch") is None, 60,
                     "autodown once the real session ended")
        finally:
            fake.kill()
            fake.wait()


def test_killed_during_runtime_install_then_finished(bed: Bed) -> None:
    daemon = bed.daemon
    daemon.stop()
    daemon.start(extra_env={"CLUSTERD_TEST_FAULTS": "launch.during_install"})
    result = ctl(bed, "launch", "-c", "crashy", "--infra", "ssh/testbed", "--", "echo hi")
    assert result.returncode == 1
    assert daemon.process is not None
    wait_for(lambda: daemon.process is not None and daemon.process.poll() is not None, 60,
             "the daemon to die")
    daemon.start(extra_env={"CLUSTERD_REFRESH_INTERVAL": "1"})
    # The record (and its host) survived; the refresh says what is missing.
    wait_for(lambda: (bed.daemon.cluster("crashy") or {}).get("status") == "INIT"
             and (bed.daemon.cluster("crashy") or {}).get("refreshed_at"), 60, "a refresh")
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert "crashy" in [h["cluster"] for h in check]
    finished = ctl(bed, "launch", "-c", "crashy", "--", "echo finished")
    assert finished.returncode == 0 and finished.stdout == "finished\n", finished.stderr
    assert ctl(bed, "down", "-y", "crashy").returncode == 0


def _unpin(bed: Bed, index: int) -> str:
    """Forget host `index`'s pinned key (the daemon must be stopped); returns its pattern."""
    host = bed.hosts[index]
    pattern = f"[{host['ip']}]:{host['port']}"
    pins = bed.daemon.state_dir / "known_hosts"
    pins.write_text("".join(line + "\n" for line in pins.read_text().splitlines()
                            if not line.startswith(pattern + " ")))
    return pattern


def test_host_keys_on_first_contact_and_in_strict_pools(bed: Bed) -> None:
    host = bed.hosts[2]
    where = f"{host['user']}@{host['ip']}:{host['port']}"
    original = bed.pools_file.read_text()

    def third_pool(strict: bool) -> None:
        bed.pools_file.write_text(
            original + f"third:\n  identity_file: {bed.key}\n  strict_host_key_checking: "
            f"{'true' if strict else 'false'}\n  hosts:\n    - ip: {host['ip']}\n"
            f"      user: {host['user']}\n      port: {host['port']}\n")

    try:
        third_pool(strict=False)
        bed.daemon.stop()
        _unpin(bed, 2)
        bed.daemon.start()
        first = ctl(bed, "launch", "-c", "keys", "--infra", "ssh/third", "--", "true")
        assert first.returncode == 0, first.stderr
        assert f"first contact with {where}: its host key ssh-ed25519 SHA256:" in first.stderr
        events = json.loads(ctl(bed, "events", "keys", "--json").stdout)
        assert any(e["kind"] == "host_key" and "SHA256:" in e["reason"] for e in events)
        assert ctl(bed, "down", "-y", "keys").returncode == 0
        # Strict: a key the daemon has not pinned and the user's known_hosts lacks is refused.
        third_pool(strict=True)
        bed.daemon.stop()
        _unpin(bed, 2)
        bed.daemon.start()
        refused = ctl(bed, "launch", "-c", "keys", "--infra", "ssh/third", "--", "true")
        assert refused.returncode == 1 and "HOST_KEY_UNKNOWN" in refused.stderr
        assert "strict_host_key_checking" in refused.stderr and "ssh-keyscan" in refused.stderr
        assert bed.daemon.cluster("keys") is None
        scanned = subprocess.run(["ssh-keyscan", "-t", "ed25519", "-p", str(host["port"]),
                                  host["ip"]], capture_output=True, text=True, timeout=30)
        user_known = Path(bed.daemon.env["HOME"]) / ".ssh" / "known_hosts"
        user_known.parent.mkdir(mode=0o700, exist_ok=True)
        user_known.write_text(scanned.stdout)
        allowed = ctl(bed, "launch", "-c", "keys", "--infra", "ssh/third", "--", "echo in")
        assert allowed.returncode == 0 and allowed.stdout == "in\n", allowed.stderr
        assert "first contact" not in allowed.stderr  # known from ~/.ssh/known_hosts
        assert ctl(bed, "down", "-y", "keys").returncode == 0
    finally:
        bed.pools_file.write_text(original)


def test_changed_host_key_is_refused(bed: Bed) -> None:
    result = ctl(bed, "launch", "-c", "pinned", "--infra", "ssh/testbed", "--", "echo first")
    assert result.returncode == 0, result.stderr
    assert ctl(bed, "down", "-y", "pinned").returncode == 0
    # Host 1 gets a new host key, as if someone else answered at its address.
    host_dir = bed.dir / "host1"
    pid = int((host_dir / "sshd.pid").read_text())
    os.kill(pid, signal.SIGTERM)
    wait_for(lambda: not pid_alive(pid), 10, "sshd to stop")
    for key in host_dir.glob("ssh_host_ed25519_key*"):
        key.unlink()
    bed.up(3)
    bed.daemon.stop()  # forget the live connection; the pin is on disk
    bed.daemon.start()
    result = ctl(bed, "launch", "-c", "pinned", "--infra", "ssh/testbed", "--", "echo again")
    assert result.returncode == 1
    assert "HOST_KEY_MISMATCH" in result.stderr
    assert "known_hosts" in result.stderr
    assert bed.daemon.cluster("pinned") is None
    check = json.loads(ctl(bed, "check", "--json").stdout)["hosts"]
    assert not check[0]["ok"] and "pinned" in check[0]["error"]


@pytest.mark.anyio
async def test_commands_too_long_for_a_command_line_go_through_a_file(
    bed: Bed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from clusterd.ssh import runner as runner_module
    from clusterd.ssh.connections import SSHConnections
    from clusterd.ssh.host_keys import HostKeyStore

    host = bed.hosts[2]
    target = SSHTarget(host["ip"], host["port"], host["user"], bed.key)
    connections = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    runner = runner_module.SSHRunner(connections, target, "host3", "python3", tmp_path)
    via_file = []
    original = runner_module.SSHRunner._run_via_file

    async def counting(self: Any, *args: Any, **kwargs: Any) -> Any:
        via_file.append(1)
        return await original(self, *args, **kwargs)

    monkeypatch.setattr(runner_module.SSHRunner, "_run_via_file", counting)
    big = "x" * 200_000
    try:
        # Above the threshold: straight through a file.
        result = await runner.run_shell(f"echo {big} | wc -c")
        assert result.exit_code == 0 and result.stdout == b"200001\n"
        assert len(via_file) == 1
        # Pretend there is no threshold: the node's "Argument list too long" sends it on.
        monkeypatch.setattr(runner_module, "INLINE_LIMIT_BYTES", 10**9)
        result = await runner.run_shell(f"echo {big} | wc -c")
        assert result.exit_code == 0 and result.stdout == b"200001\n"
        assert len(via_file) == 2
        leftovers = await runner.run(["bash", "-c", "ls .clusterd/tmp | wc -l"])
        assert leftovers.stdout == b"0\n"
    finally:
        await connections.close_all()


@pytest.mark.anyio
async def test_a_proxy_command_carries_the_connection(bed: Bed, tmp_path: Path) -> None:
    """ssh_proxy_command (aws config) as OpenSSH's ProxyCommand, with its %h %p tokens."""
    from clusterd.ssh.connections import SSHConnections
    from clusterd.ssh.host_keys import HostKeyStore

    host = bed.hosts[2]
    log = tmp_path / "relay.log"
    relay = Path(__file__).resolve().parents[1] / "tools" / "relay.py"
    target = SSHTarget(host["ip"], host["port"], host["user"], bed.key,
                       proxy_command=f"{sys.executable} {relay} %h %p {log}")
    connections = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    try:
        result = await connections.run(target, "echo through the relay")
        assert result.exit_code == 0 and result.stdout == b"through the relay\n"
        assert log.read_text() == f"relayed {host['ip']}:{host['port']}\n"
    finally:
        await connections.close_all()


@pytest.mark.anyio
async def test_a_file_streamed_to_a_command_arrives_whole_over_aes_gcm(
        bed: Bed, tmp_path: Path) -> None:
    """A local file as a command's stdin (how the runtime reaches a node): every byte, in
    order, as the command reads it; a command that stops reading early ends the stream
    without a hang; and the channel is AES-GCM, preferred for its cost per byte."""
    from clusterd.ssh.connections import SSHConnections
    from clusterd.ssh.host_keys import HostKeyStore

    host = bed.hosts[2]
    target = SSHTarget(host["ip"], host["port"], host["user"], bed.key)
    payload = tmp_path / "payload"
    payload.write_bytes(os.urandom(3 * 1024 * 1024 + 17))  # several chunks, one partial
    connections = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    try:
        whole = await connections.run(target, "sha256sum", input=payload)
        assert whole.exit_code == 0, whole.stderr
        assert whole.stdout.split()[0].decode() == hashlib.sha256(
            payload.read_bytes()).hexdigest()
        early = await connections.run(target, "head -c 10 | wc -c", input=payload,
                                      timeout_s=30)
        assert early.exit_code == 0 and early.stdout.strip() == b"10", early.stderr
        node = await connections.get(target)
        async with node.channel() as conn:
            assert conn.get_extra_info("send_cipher") == "aes128-gcm@openssh.com"
    finally:
        await connections.close_all()
