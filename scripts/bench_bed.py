"""A test bed (scripts/testbed ec2|k8s) and a daemon of its own inside the bed's namespace, for
the benchmarks that need one; both go away at `down`."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

TESTBED = Path(__file__).resolve().parent / "testbed"
# `start` names its cluster first: "[NAME] [   0.1s] ..."
PROGRESS = re.compile(r"^(?:\[[^\]\s]+\] )?\[\s*([\d.]+)s\] (.*)$")
# Progress lines that open each phase of a launch (or a start), in order.
PHASES = (("placement", "checking where"), ("provision", "creating nodes on"),
          ("provision", "starting stopped cluster"),
          ("wheelhouse", "preparing the runtime"), ("copy", "copying the runtime"),
          ("install", "installing the runtime on"), ("ray", "starting Ray"),
          ("agent", "starting the agent"), ("up", " is UP"))


class BedDaemon:
    """The `kind` test bed, and a daemon of its own inside the bed's namespace."""

    kind = ""

    def __init__(self, bench: Any) -> None:
        self.bench = bench
        self.dir = Path(tempfile.mkdtemp(prefix=f"cdb{self.kind}-", dir="/tmp"))
        self.netns = f"cdbench-{self.kind}-{os.getpid()}"
        self.root = Path(tempfile.mkdtemp(prefix="cdba-", dir="/tmp"))
        self.daemon: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        self.bed_env: dict[str, str] = {}  # what `testbed env` says, once it is up

    def up_args(self) -> list[str]:
        return []

    def daemon_env(self, bed_env: dict[str, str]) -> dict[str, str]:
        """What of the bed's environment the daemon gets."""
        raise NotImplementedError

    def up(self) -> None:
        done = self._testbed("up", "--netns", self.netns, *self.up_args())
        if done.returncode != 0:
            raise SystemExit(f"{self.kind} test bed failed: {done.stderr}")
        self.bed_env = bed_env = json.loads(self._testbed("env", "--json").stdout)
        runtime = self.root / "rt"
        runtime.mkdir(mode=0o700)
        (self.root / "home").mkdir()
        self.env = {**self.bench.env, **self.daemon_env(bed_env),
                    "CLUSTERD_WHEELHOUSE_DIR": bed_env["CLUSTERD_WHEELHOUSE_DIR"],
                    "XDG_RUNTIME_DIR": str(runtime),
                    # Its log is kept with the run's output (see down): info says per step
                    # where a launch's time went.
                    "CLUSTERD_LOG_LEVEL": "info",
                    "XDG_STATE_HOME": str(self.root / "state"),
                    "XDG_CONFIG_HOME": str(self.root / "config"),
                    "HOME": str(self.root / "home")}
        self.start_daemon()

    @property
    def state_dir(self) -> Path:
        return self.root / "state" / "clusterd"

    def start_daemon(self) -> None:
        socket_path = self.root / "rt" / "clusterd" / "clusterd.sock"
        with open(self.root / "daemon.log", "ab") as log:
            self.daemon = subprocess.Popen(
                ["ip", "netns", "exec", self.netns, sys.executable, "-m", "clusterd"],
                env=self.env, stdout=log, stderr=log, start_new_session=True, cwd="/")
        deadline = time.monotonic() + 30
        while not socket_path.exists():
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                raise SystemExit(f"clusterd in the bed did not start; see {self.root}")
            time.sleep(0.05)

    def stop_daemon(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.daemon.send_signal(signal.SIGTERM)
            self.daemon.wait(30)

    def ctl(self, *args: str, timeout: float = 900) -> subprocess.CompletedProcess[str]:
        return subprocess.run(["ip", "netns", "exec", self.netns, str(
            Path(sys.executable).with_name("clusterctl")), *args], env=self.env,
            capture_output=True, text=True, timeout=timeout, cwd=self.root)

    def run(self, *cmd: str, timeout: float = 300) -> str:
        """A command inside the bed's namespace, with the daemon's environment."""
        done = subprocess.run(["ip", "netns", "exec", self.netns, *cmd], env=self.env,
                              capture_output=True, text=True, timeout=timeout)
        if done.returncode != 0:
            raise SystemExit(f"{cmd[0]} in the bed failed: {done.stderr}")
        return done.stdout

    def python(self, code: str) -> str:
        return self.run(sys.executable, "-c", code)

    def down(self) -> None:
        try:
            for cluster in json.loads(self.ctl("status", "--json").stdout or "[]"):
                self.ctl("down", "-y", "--purge", cluster["name"])
        finally:
            self.stop_daemon()
            self._testbed("down")
            log = self.root / "daemon.log"
            if log.exists():  # kept with the run's output: where the phases' time went
                shutil.copyfile(log, self.bench.out / f"{self.kind}-daemon.log")
            shutil.rmtree(self.root, ignore_errors=True)

    def _testbed(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, str(TESTBED), self.kind, *args, "--dir",
                               str(self.dir)], capture_output=True, text=True, timeout=2400)


def phases(stderr: str, wall: float) -> dict[str, float]:
    """Seconds spent in each launch phase, from the progress lines' timestamps."""
    marks: list[tuple[str, float]] = []
    for line in stderr.splitlines():
        found = PROGRESS.match(line.strip())
        if not found:
            continue
        for phase, text in PHASES:
            if text in found.group(2) and phase not in dict(marks):
                marks.append((phase, float(found.group(1))))
    marks.append(("job", wall))
    return {name: round(marks[i + 1][1] - at, 2) for i, (name, at) in enumerate(marks[:-1])}


def timed(run: Any) -> tuple[float, subprocess.CompletedProcess[str]]:
    started = time.monotonic()
    done = run()
    return time.monotonic() - started, done


def busy_cpu_seconds() -> float:
    """CPU time the whole machine has spent busy (not idle, not waiting on I/O) since boot:
    a bed's nodes share this machine's cores, so a launch's wall time has this floor."""
    with open("/proc/stat") as stat:
        fields = [int(v) for v in stat.readline().split()[1:]]
    user, nice, system, _idle, _iowait, irq, softirq, steal = fields[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def timed_cpu(run: Any) -> tuple[float, float, subprocess.CompletedProcess[str]]:
    """`timed`, with the machine's busy CPU seconds over the same span."""
    cpu = busy_cpu_seconds()
    wall, done = timed(run)
    return wall, busy_cpu_seconds() - cpu, done


def split(rows: list[dict[str, float]]) -> str:
    """Median seconds per phase over runs, as `phase:s,...`."""
    import statistics

    keys = list(dict.fromkeys(k for row in rows for k in row))
    return ",".join(f"{k}:{statistics.median(r.get(k, 0.0) for r in rows):.1f}" for k in keys)


def launch_beside_local(bench: Any, bed: BedDaemon, name: str, infra: str, runs: int,
                        cpus: str, task: Path | None = None, then_start: bool = True) -> None:
    """A 2-node launch on the bed's provider against a local launch, alternating, by phase
    (the remote one runs `task`, a YAML file, if given: `true` otherwise)."""
    import statistics

    what = [str(task)] if task is not None else ["--", "true"]
    remote, local, remote_phases, local_phases = [], [], [], []
    remote_cpu, local_cpu = [], []
    for index in range(runs):
        wall, cpu, done = timed_cpu(lambda i=index: bed.ctl(
            "launch", "-c", f"bl{i}", "--infra", infra, "--num-nodes", "2", "--cpus", cpus,
            *what))
        if done.returncode != 0:
            raise SystemExit(f"{infra} launch failed: {done.stderr}")
        remote.append(wall)
        remote_cpu.append(cpu)
        remote_phases.append(phases(done.stderr, wall))
        if index < runs - 1:
            bed.ctl("down", "-y", f"bl{index}")
        wall, cpu, done = timed_cpu(lambda i=index: bench.ctl("launch", "-c", f"bloc{i}", "--",
                                                              "true"))
        if done.returncode != 0:
            raise SystemExit(f"local launch failed: {done.stderr}")
        local.append(wall)
        local_cpu.append(cpu)
        local_phases.append(phases(done.stderr, wall))
        if index < runs - 1:
            bench.ctl("down", "-y", f"bloc{index}")
    # The bed's own provisioning (instances made and booted: on EC2, 20-40 s nobody can
    # remove) is not ours: the goal is on what follows it.
    ours = [wall - row.get("provision", 0.0) for wall, row in zip(remote, remote_phases,
                                                                   strict=True)]
    local_s = statistics.median(local)
    bench.record(name, statistics.median(remote), "s", baseline=local_s,
                 baseline_name="local launch", phases=split(remote_phases),
                 local_phases=split(local_phases),
                 without_provision_ratio=round(statistics.median(ours) / local_s, 2),
                 # Busy CPU seconds of the whole machine over each launch: the bed's nodes
                 # share its cores with the daemon and the local cluster.
                 cpu_s=round(statistics.median(remote_cpu), 1),
                 local_cpu_s=round(statistics.median(local_cpu), 1),
                 cores=os.cpu_count())
    last = runs - 1
    if bed.kind == "ec2" and then_start:  # instances kept (Kubernetes pods cannot stop)
        start_beside_local(bench, bed, name.replace("launch", "start"), f"bl{last}",
                           f"bloc{last}")
    bed.ctl("down", "-y", f"bl{last}")
    bench.ctl("down", "-y", f"bloc{last}")


def start_beside_local(bench: Any, bed: BedDaemon, name: str, remote: str,
                       local: str, runs: int = 2) -> None:
    """`start` of the stopped remote cluster against `start` of a stopped local one."""
    import statistics

    remote_walls, local_walls, remote_phases, local_phases = [], [], [], []
    cpus: dict[str, list[float]] = {remote: [], local: []}
    for _ in range(runs):
        for ctl, cluster, walls, rows in ((bed.ctl, remote, remote_walls, remote_phases),
                                          (bench.ctl, local, local_walls, local_phases)):
            stopped = ctl("stop", "-y", cluster)
            if stopped.returncode != 0:
                raise SystemExit(f"stop {cluster} failed: {stopped.stderr}")
            wall, cpu, done = timed_cpu(lambda c=cluster, run=ctl: run("start", c))
            if done.returncode != 0:
                raise SystemExit(f"start {cluster} failed: {done.stderr}")
            walls.append(wall)
            cpus[cluster].append(cpu)
            rows.append(phases(done.stderr, wall))
    # As for a launch: the instances' own start and boot (the bed's, and on EC2 tens of
    # seconds nobody can remove) is shown apart.
    ours = [wall - row.get("provision", 0.0) for wall, row in zip(remote_walls, remote_phases,
                                                                   strict=True)]
    bench.record(name, statistics.median(remote_walls), "s",
                 baseline=statistics.median(local_walls), baseline_name="local start",
                 target="≤ 1.2x a local start, after the instances' own start",
                 ok=statistics.median(ours) <= 1.2 * statistics.median(local_walls),
                 without_provision_ratio=round(statistics.median(ours)
                                               / statistics.median(local_walls), 2),
                 phases=split(remote_phases), local_phases=split(local_phases),
                 cpu_s=round(statistics.median(cpus[remote]), 1),
                 local_cpu_s=round(statistics.median(cpus[local]), 1))


# (cloud name, requested resources, launched resources, handle) of one record.
Record = tuple[str, dict[str, Any], dict[str, Any], dict[str, Any]]


def insert_records(db_path: Path, provider: str, status: str, records: list[Record],
                   created: list[float] | None = None, nodes: list[int] | None = None) -> None:
    """Cluster records as launches would have left them, straight into a stopped daemon's
    database (the benchmark's clusters are many; launching each would take hours). A
    record's name is its cloud name without the launch's suffix; each was made `created`
    (default now) with `nodes` nodes (default 1)."""
    now = time.time()
    made = created or [now] * len(records)
    sizes = nodes or [1] * len(records)
    db = sqlite3.connect(db_path)
    try:
        with db:
            db.executemany(
                "INSERT INTO clusters (name, provider, cloud_name, status, status_reason,"
                " num_nodes, requested_resources, launched_resources, handle, config_hash,"
                " created_at, launched_at, status_updated_at, ever_up)"
                " VALUES (?, ?, ?, ?, 'inserted by the benchmark', ?, ?, ?, ?,"
                " 'bench', ?, ?, ?, 1)",
                [(cloud_name.rsplit("-", 1)[0], provider, cloud_name, status, size,
                  json.dumps(requested), json.dumps(launched), json.dumps(handle),
                  at, at, now) for (cloud_name, requested, launched, handle), at, size
                 in zip(records, made, sizes, strict=True)],
            )
    finally:
        db.close()
