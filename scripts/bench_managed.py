"""Managed-job benchmarks on the EC2 test bed (need root), side by side in one run:

- recovery time: from a spot preemption (`testbed ec2 preempt`) to the first line the job's
  next attempt prints (as `clusterctl jobs logs` shows it), against a fresh `clusterctl
  launch` of the same task to its first line, interleaved in the same run (5 fresh launches,
  10 recoveries). Goal: recovery ≤ 1.2x fresh launch + detection lag (medians); each
  recovery less its lag against the fresh launch just before it is reported too.
- detection lag: from the preemption (the bed controller's own log time of it) to the job's
  RECOVERING event (its time as the daemon recorded it: `jobs_events`), p50 and max
  over 10 preemptions. Goal ≤ 5 s.
- daemon memory (VmRSS from /proc) watching 200 managed jobs, against the same daemon
  watching none. 200 clusters do not fit on this machine, so the 200 are jobs that lost their
  spot cluster during a capacity outage (a bed fault rule refuses every spot RunInstances):
  each has a live driver in the daemon that relaunches with failover, records why that
  failed, and waits to try again, as after a real outage. They are written into the stopped
  daemon's database (the rows as the daemon's own store writes them) and the daemon is
  restarted, as a daemon killed during such an outage would find them; RSS is sampled once
  every driver has begun its relaunch (moto answers them slowly: most are still under way).
  Three jobs really RUNNING (log streamed, cluster polled) are watched beside them, and also
  measured without them. Every daemon measured was freshly started and went through one
  launch refused for capacity first.

Run through `scripts/bench --only managed`. The bed gets a namespace and a directory of its own,
and a daemon inside it; all go away at the end.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from bench_aws import AWSBed
from bench_bed import phases

PREEMPTIONS = 10
FRESH_EVERY = 2  # a fresh launch before every second preemption
WAITING_JOBS = 200
RUNNING_JOBS = 3  # really running beside the waiting ones: the benchmark's own job, and two
# The waiting jobs' one zone: each relaunch round is then one RunInstances per job (moto, one
# process on a shared machine, answers some 60 calls a second; five zones made the first
# round of 200 relaunches take minutes).
WAITING_INFRA = "aws/us-east-1/us-east-1a"
RSS_SAMPLES = 15
FINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS",
         "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"}
FIRST = re.compile(r"^first line attempt=(\S+)")
# The bed controller's log line of a preemption: its time is when the instance was terminated.
PREEMPTED = re.compile(r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),(\d{3}) \S+ INFO preempted spot "
                       r"instance (\S+) ")
TASK = """\
resources:
  cpus: 2
  use_spot: true
IMAGES
run: |
  echo "first line attempt=${SKYPILOT_MANAGED_JOB_ATTEMPT:-none} task=$SKYPILOT_TASK_ID"
  while true; do sleep 5; echo tick; done
"""


class ManagedBed(AWSBed):
    """The EC2 bed with its runtime image (as users of real AWS bake their own AMI: launches
    skip the install), and a daemon inside it."""

    def up_args(self) -> list[str]:
        return [*super().up_args(), "--runtime-image"]

    def daemon_env(self, bed_env: dict[str, str]) -> dict[str, str]:
        self.images: dict[str, str] = json.loads(
            bed_env.get("CLUSTERD_TESTBED_RUNTIME_IMAGES") or "{}")
        # The controller's decisions are logged at info: what to read when a recovery
        # misbehaves (see keep_logs).
        return {**super().daemon_env(bed_env), "CLUSTERD_LOG_LEVEL": "info"}

    def keep_logs(self) -> Path:
        """The daemon's and the bed's logs, copied where `down` does not remove them."""
        kept = Path(tempfile.mkdtemp(prefix="cdbm-logs-", dir="/tmp"))
        for path in [self.root / "daemon.log", self.dir / "controller.log",
                     *self.root.glob("*.err")]:
            if path.exists():
                shutil.copy(path, kept / path.name)
        return kept

    def task(self) -> str:
        images = "".join(f"    {region}: {ami}\n" for region, ami in self.images.items())
        return TASK.replace("IMAGES\n", f"  image_id:\n{images}" if images else "")

    # -- the daemon ------------------------------------------------------------------------

    def restart_daemon(self) -> None:
        self.stop_daemon()
        self.start_daemon()

    def stop_daemon(self) -> None:
        """SIGTERM; SIGKILL (a crash it recovers from) if launches under way hold it up."""
        if self.daemon is None or self.daemon.poll() is not None:
            return
        self.daemon.send_signal(signal.SIGTERM)
        try:
            self.daemon.wait(60)
        except subprocess.TimeoutExpired:
            self.daemon.kill()
            self.daemon.wait(30)

    def start_daemon(self) -> None:
        super().start_daemon()
        wait_for(lambda: self.ctl("jobs", "queue", "--json", timeout=30).returncode == 0, 60,
                 "the restarted daemon to answer")

    def memory(self) -> dict[str, int]:
        """The daemon's VmRSS and VmHWM (KiB), from /proc."""
        assert self.daemon is not None
        found = {}
        for line in Path(f"/proc/{self.daemon.pid}/status").read_text().splitlines():
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM"):
                found[key] = int(value.split()[0])
        return found

    # -- managed jobs ----------------------------------------------------------------------

    def submit(self, name: str) -> int:
        path = self.root / f"{name}.yaml"
        path.write_text(self.task())
        done = self.ctl("jobs", "launch", "-d", "-n", name, "--infra", "aws/us-east-1",
                        str(path))
        found = re.search(r"Managed job (\d+) submitted", done.stderr)
        if done.returncode != 0 or not found:
            raise SystemExit(f"jobs launch failed: {done.stderr}")
        return int(found.group(1))

    def queue(self) -> dict[int, dict[str, Any]]:
        done = self.ctl("jobs", "queue", "--json", "--all", timeout=60)
        if done.returncode != 0:
            raise SystemExit(f"jobs queue failed: {done.stderr}")
        return {j["job_id"]: j for j in json.loads(done.stdout)}

    def wait_job(self, job_id: int, wanted: set[str], timeout: float) -> dict[str, Any]:
        found: dict[str, Any] = {}

        def reached() -> bool:
            found.update(self.queue()[job_id])
            return found["status"] in wanted

        wait_for(reached, timeout, f"managed job {job_id} to be one of {sorted(wanted)}",
                 interval=0.5, detail=lambda: str(found))
        return found

    def live_instance(self, cluster: str) -> str:
        """The running instance of a cluster, as the bed holds it."""
        status = json.loads(self._testbed("status", "--json").stdout)
        found = [str(i["id"]) for rows in status["regions"].values() for i in rows
                 if i["tags"].get("clusterd-cluster") == cluster and i["state"] == "running"]
        if len(found) != 1:
            raise SystemExit(f"cluster {cluster} has {len(found)} running instances")
        return found[0]

    def preempt(self, instance: str) -> float:
        """Preempt `instance`; when the bed terminated it (its controller's log time)."""
        before = time.time()
        done = self._testbed("preempt", instance)
        if done.returncode != 0:
            raise SystemExit(f"preempt failed: {done.stderr}")
        for line in reversed((self.dir / "controller.log").read_text().splitlines()):
            found = PREEMPTED.match(line)
            if found and found.group(3) == instance:
                return time.mktime(time.strptime(found.group(1), "%Y-%m-%d %H:%M:%S")) + \
                    int(found.group(2)) / 1000
        return before  # no log line: the earliest it can have been

    def event_time(self, job_id: int, to_status: str, after: float) -> float | None:
        """When the daemon recorded (its `jobs_events`) the job's first change to
        `to_status` after `after`."""
        from clusterctl import Client
        from clusterctl.protocol import JobsEventsArgs

        with Client(self.root / "rt" / "clusterd" / "clusterd.sock", autostart=False) as c:
            events = c.call(JobsEventsArgs(job_id=job_id))["events"]
        times = [float(e["ts"]) for e in events if e["to_status"] == to_status
                 and e["from_status"] != to_status and e["ts"] >= after]
        return min(times, default=None)


class LogFollower:
    """`clusterctl jobs logs ID` followed in a thread: each line with when it arrived."""

    def __init__(self, bed: ManagedBed, job_id: int) -> None:
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        self._stderr = bed.root / f"follow-{job_id}.err"
        with open(self._stderr, "w") as err:
            self._process = subprocess.Popen(
                ["ip", "netns", "exec", bed.netns,
                 str(Path(sys.executable).with_name("clusterctl")), "jobs", "logs", str(job_id)],
                env=bed.env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=bed.root)
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        assert self._process.stdout is not None
        for line in self._process.stdout:
            with self._changed:
                self.lines.append((time.time(), line.rstrip("\n")))
                self._changed.notify_all()

    def first_line(self, attempt: int, timeout: float) -> float:
        """When the first line of `attempt` arrived (waiting for it up to `timeout`)."""
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for at, line in self.lines:
                    found = FIRST.match(line)
                    if found and found.group(1) == str(attempt):
                        return at
                left = deadline - time.monotonic()
                ended = self._process.poll()
                if ended is not None:
                    raise SystemExit(f"`jobs logs` ended (exit {ended}) before attempt "
                                     f"{attempt} printed: {self._stderr.read_text()[-2000:]}; "
                                     f"last lines {self.lines[-5:]}")
                if left <= 0:
                    raise SystemExit(f"attempt {attempt} printed nothing in {timeout:.0f} s: "
                                     f"{self.lines[-5:]}")
                self._changed.wait(min(left, 1.0))

    def close(self) -> None:
        self._process.send_signal(signal.SIGINT)  # detaches; the job goes on
        try:
            self._process.wait(10)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait(10)
        self._thread.join(10)


def wait_for(check: Any, timeout: float, what: str, interval: float = 1.0,
             detail: Any = None) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            extra = f" ({detail()})" if detail else ""
            raise SystemExit(f"timed out after {timeout:.0f} s waiting for {what}{extra}")
        time.sleep(interval)


def fresh_launch(bed: ManagedBed, name: str) -> tuple[float, dict[str, float]]:
    """A `clusterctl launch` of the task: seconds to its first line, and its phases."""
    path = bed.root / "fresh.yaml"
    path.write_text(bed.task())
    stderr = bed.root / f"{name}.err"
    with open(stderr, "w") as err:
        started = time.monotonic()
        process = subprocess.Popen(
            ["ip", "netns", "exec", bed.netns, str(Path(sys.executable).with_name("clusterctl")),
             "launch", "-c", name, "--infra", "aws/us-east-1", str(path)],
            env=bed.env, stdout=subprocess.PIPE, stderr=err, text=True, cwd=bed.root)
        assert process.stdout is not None
        line = process.stdout.readline()
        first = time.monotonic() - started
        process.send_signal(signal.SIGINT)  # detaches; the job goes on until the down
        process.wait(30)
    if not FIRST.match(line):
        raise SystemExit(f"fresh launch printed {line!r}: {stderr.read_text()[-3000:]}")
    split = phases(stderr.read_text(), first)
    down = bed.ctl("down", "-y", name)
    if down.returncode != 0:
        raise SystemExit(f"down {name} failed: {down.stderr}")
    return first, split


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))]


def measure_recovery(bench: Any, bed: ManagedBed) -> int:
    """Preempt one spot job PREEMPTIONS times; fresh launches interleaved. Returns the job."""
    job_id = bed.submit("bench")
    running = bed.wait_job(job_id, {"RUNNING"} | FINAL, 600)
    if running["status"] != "RUNNING":
        raise SystemExit(f"managed job {job_id} did not start: {running}")
    cluster = running["cluster"]
    follower = LogFollower(bed, job_id)
    lags: list[float] = []
    recoveries: list[float] = []
    relaunches: list[float] = []  # RECOVERING -> RUNNING, as recorded
    fresh: list[float] = []
    fresh_phases: list[dict[str, float]] = []
    try:
        follower.first_line(1, 300)
        for index in range(PREEMPTIONS):
            if index % FRESH_EVERY == 0:
                first, split = fresh_launch(bed, f"fresh{index}")
                fresh.append(first)
                fresh_phases.append(split)
            attempt = index + 1
            at = bed.preempt(bed.live_instance(cluster))
            printed = follower.first_line(attempt + 1, 600)
            recovering = bed.event_time(job_id, "RECOVERING", at - 1)
            rerun = bed.event_time(job_id, "RUNNING", at)
            if recovering is None or rerun is None:
                raise SystemExit(f"managed job {job_id} has no RECOVERING/RUNNING event after "
                                 f"preemption {attempt}")
            lags.append(recovering - at)
            relaunches.append(rerun - recovering)
            recoveries.append(printed - at)
            print(f"  preemption {attempt}: RECOVERING after {lags[-1]:.2f} s, first new line "
                  f"after {recoveries[-1]:.1f} s", file=sys.stderr)
    finally:
        follower.close()
    from bench_bed import split as split_phases

    lag = statistics.median(lags)
    bench.record("managed_detection_lag_p50", lag, "s", target="≤ 5 s (p50 and max)",
                 ok=max(lags) <= 5, max_s=round(max(lags), 2), preemptions=len(lags),
                 lags_s=[round(v, 2) for v in lags],
                 how="bed controller's log time of the preemption -> the daemon's "
                     "RECOVERING event (its recorded time, from jobs_events)")
    recovery, base = statistics.median(recoveries), statistics.median(fresh)
    goal = 1.2 * base + lag
    # Each recovery against the fresh launch just before it (the machine's load changes
    # over minutes; neighbours see the same load): less noisy than the ratio of medians.
    paired = [(r - lags[i]) / fresh[i // FRESH_EVERY] for i, r in enumerate(recoveries)]
    bench.record("managed_recovery_to_first_line", recovery, "s", baseline=base,
                 baseline_name="fresh clusterctl launch of the same task, to its first line",
                 target="≤ 1.2x fresh + detection lag", ok=recovery <= goal,
                 goal_s=round(goal, 2), p90=round(percentile(recoveries, 90), 1),
                 max_s=round(max(recoveries), 1), samples=len(recoveries),
                 fresh_samples=len(fresh), fresh_s=[round(v, 1) for v in fresh],
                 recoveries_s=[round(v, 1) for v in recoveries],
                 relaunch_p50_s=round(statistics.median(relaunches), 1),
                 paired_ratio_without_lag_p50=round(statistics.median(paired), 2),
                 local_phases=split_phases(fresh_phases))
    return job_id


def insert_waiting_jobs(db_path: Path, count: int, task_yaml: str, cwd: Path) -> list[int]:
    """`count` spot jobs RECOVERING after losing their cluster in us-east-1, as the daemon's
    own store writes them, straight into the stopped daemon's database (placed where they
    ran, one attempt and one recovery behind them, no cluster now)."""
    from clusterctl.protocol import ManagedJobStatus
    from clusterd.managed.store import ManagedJobRecord, SubmittedTask, cluster_name_for
    from clusterd.providers.base import Placement

    now = time.time()
    task = SubmittedTask.storable(yaml_text=task_yaml, source="waiting.yaml", cwd=str(cwd),
                                  infra=WAITING_INFRA)
    reason = "inserted by the benchmark: cluster lost (spot preemption) during an outage"
    db = sqlite3.connect(db_path)
    try:
        with db:
            (last,) = db.execute("SELECT COALESCE(MAX(id), 0) FROM managed_jobs").fetchone()
            ids = list(range(last + 1, last + 1 + count))
            rows = []
            for job_id in ids:
                name = f"wait{job_id}"
                cluster = cluster_name_for(job_id, name)
                record = ManagedJobRecord(
                    id=job_id, name=name, task=task, status=ManagedJobStatus.RECOVERING,
                    cluster=cluster, task_id=f"sky-managed-bench-{job_id}_{cluster}",
                    submitted_at=now, status_updated_at=now, status_reason=reason,
                    attempts=1, recoveries=1, started_at=now, run_seconds=1.0,
                    placed=Placement("aws", "us-east-1", "us-east-1a", "c6i.large", 2, 4,
                                     spot=True))
                rows.append(record.to_row())
            columns = list(rows[0])
            db.executemany(f"INSERT INTO managed_jobs ({', '.join(columns)}) VALUES "
                           f"({', '.join('?' for _ in columns)})",
                           [[row[c] for c in columns] for row in rows])
            db.executemany("INSERT INTO managed_job_events (ts, job_id, from_status, to_status,"
                           " reason) VALUES (?, ?, 'RUNNING', 'RECOVERING', ?)",
                           [(now, job_id, reason) for job_id in ids])
    finally:
        db.close()
    return ids


def sample_memory(bed: ManagedBed) -> dict[str, float]:
    """VmRSS once a second for RSS_SAMPLES seconds: median and max, and the high-water mark."""
    rss = []
    for _ in range(RSS_SAMPLES):
        rss.append(bed.memory()["VmRSS"])
        time.sleep(1)
    return {"rss_kib": statistics.median(rss), "rss_max_kib": max(rss),
            "hwm_kib": bed.memory()["VmHWM"]}


def warm_up(bed: ManagedBed) -> None:
    """One launch refused for capacity (the fault rule is on), so that every daemon measured
    has been through the launch and failover code once."""
    path = bed.root / "warm.yaml"
    path.write_text(bed.task())
    done = bed.ctl("launch", "-c", "warm", "--infra", "aws/us-east-1", str(path), timeout=300)
    if done.returncode == 0 or "InsufficientInstanceCapacity" not in done.stderr:
        raise SystemExit(f"the warm-up launch was not refused for capacity: {done.stderr}")


def log_grows(bed: ManagedBed, job_id: int) -> bool:
    """Whether the job's local log gets a new line within 15 s (its stream is live)."""
    path = bed.state_dir / "managed-jobs" / f"{job_id}.log"
    size = path.stat().st_size
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        if path.stat().st_size > size:
            return True
        time.sleep(0.5)
    return False


def fault_capacity(bed: ManagedBed) -> None:
    """No spot capacity anywhere: every spot RunInstances is refused."""
    done = bed._testbed("fault", "add", "--code", "InsufficientInstanceCapacity", "--action",
                        "RunInstances", "--market", "spot")
    if done.returncode != 0:
        raise SystemExit(f"fault add failed: {done.stderr}")


def relaunching(bed: ManagedBed, waiting: list[int]) -> int:
    """How many of the waiting jobs' drivers have begun a relaunch (its cluster recorded, or
    a relaunch refused and the job waiting to try again): -1 if one is not RECOVERING."""
    jobs = bed.queue()
    done = bed.ctl("status", "--json", timeout=60)
    clusters = {c["name"] for c in json.loads(done.stdout or "[]")}
    if any(jobs[j]["status"] != "RECOVERING" for j in waiting):
        raise SystemExit(f"a waiting job left RECOVERING: "
                         f"{[jobs[j] for j in waiting if jobs[j]['status'] != 'RECOVERING']}")
    return sum(1 for j in waiting if jobs[j]["cluster"] in clusters
               or "trying again" in jobs[j]["status_reason"])


def measure_memory(bench: Any, bed: ManagedBed, running: list[int],
                   baseline: dict[str, float]) -> None:
    """The daemon restarted with the RUNNING jobs, then with WAITING_JOBS more waiting."""
    fault_capacity(bed)
    bed.restart_daemon()
    warm_up(bed)
    for job_id in running:
        bed.wait_job(job_id, {"RUNNING"}, 60)
        wait_for(lambda j=job_id: log_grows(bed, j), 60, f"job {job_id}'s log to grow")
    with_running = sample_memory(bed)
    bed.stop_daemon()
    waiting = insert_waiting_jobs(bed.state_dir / "state.db", WAITING_JOBS, bed.task(),
                                  bed.root)
    started = time.monotonic()
    bed.start_daemon()
    # Measured once every driver is in its relaunch loop; moto answers the 200 relaunches
    # slowly (see WAITING_INFRA), so most are still under way while the samples are taken.
    wait_for(lambda: relaunching(bed, waiting) == len(waiting), 300,
             f"{WAITING_JOBS} drivers to begin a relaunch", interval=2)
    begun = time.monotonic() - started
    for job_id in running:
        wait_for(lambda j=job_id: log_grows(bed, j), 60, f"job {job_id}'s log to grow")
    with_all = sample_memory(bed)
    refused = sum(1 for j in waiting if "trying again" in bed.queue()[j]["status_reason"])
    per_job = (with_all["rss_kib"] - with_running["rss_kib"]) / WAITING_JOBS
    per_running = (with_running["rss_kib"] - baseline["rss_kib"]) / len(running)
    watched = WAITING_JOBS + len(running)
    bench.record(f"managed_daemon_rss_{watched}_jobs", with_all["rss_kib"] / 1024, "MiB",
                 baseline=baseline["rss_kib"] / 1024, baseline_name="the same daemon, 0 jobs",
                 per_job_kib=round((with_all["rss_kib"] - baseline["rss_kib"]) / watched, 1),
                 per_waiting_job_kib=round(per_job, 1),
                 per_running_job_kib=round(per_running, 1),
                 waiting=WAITING_JOBS, running=len(running),
                 rss_with_running_only_mib=round(with_running["rss_kib"] / 1024, 1),
                 rss_max_mib=round(with_all["rss_max_kib"] / 1024, 1),
                 hwm_mib=round(with_all["hwm_kib"] / 1024, 1),
                 baseline_hwm_mib=round(baseline["hwm_kib"] / 1024, 1),
                 all_relaunching_after_s=round(begun, 1), relaunches_refused=refused,
                 how=(f"VmRSS (median of {RSS_SAMPLES} samples 1 s apart) of a freshly started "
                      "daemon, after one launch refused for capacity: with 0 jobs; with "
                      f"{len(running)} RUNNING jobs (log streamed, health polled); with those "
                      f"and {WAITING_JOBS} RECOVERING jobs (no spot capacity anywhere: a bed "
                      "fault rule), sampled once every one of their drivers had begun a "
                      "relaunch; relaunches_refused of them had been refused and were waiting "
                      "to try again, the others' relaunches were under way"))


def bench_managed(bench: Any) -> None:
    print("(s) managed jobs on the EC2 bed: recovery time vs a fresh launch, detection lag, "
          f"daemon memory with {WAITING_JOBS + RUNNING_JOBS} jobs", file=sys.stderr)
    bed = ManagedBed(bench)
    try:
        bed.up()
        # The baseline daemon: fresh, 0 jobs, through one launch refused for capacity.
        fault_capacity(bed)
        warm_up(bed)
        baseline = sample_memory(bed)
        bed._testbed("fault", "clear")
        job_id = measure_recovery(bench, bed)
        others = [bed.submit(f"run{i}") for i in range(RUNNING_JOBS - 1)]
        for other in others:
            bed.wait_job(other, {"RUNNING"}, 600)
        measure_memory(bench, bed, [job_id, *others], baseline)
    except BaseException:
        print(f"  the logs are kept in {bed.keep_logs()}", file=sys.stderr)
        raise
    finally:
        # The jobs are not cancelled one by one (200 teardowns through moto take minutes): the
        # daemon stops, and the bed goes down with every instance in it.
        bed.stop_daemon()
        bed.down()
