"""The cost ledger at scale (issue 39 §4): a real daemon whose state database holds SCALE
clusters of history (HISTORY_DAYS of intervals, most torn down, LIVE of them still up on the
in-memory load-test provider) and JOBS_PER_CLUSTER jobs each in their kept copies (where the
report reads jobs' times from), measured at a small and a large scale in the same run:

- the `cost_report` op over the socket, the default window (30 days) and --days 90, ROUNDS
  rounds of each interleaved (median and p95; target ≤ 200 ms at the large scale), as
  clusterctl asks for it (the 100 costliest clusters listed, totals over all), and 90 days of
  one cluster (`cluster`: what a dashboard cluster page asks); then 90 days with every
  cluster listed (--limit 0);
- `status` (as clusterctl asks for it: in columns, with each cluster's $/h and cost) with the
  LIVE clusters up;
- the daemon's RSS (VmRSS) before the history is loaded, after, and after the reports.

The daemon settles every torn-down cluster's split at start, in the background
(cost/settled.py; one that lived through this history would have settled them hourly): the
first report, asked at once, waits for what is left of that, so it is timed apart
(`first_report_ms`), and the rounds are what every later report costs.

The history is written by a generator straight into the stopped daemon's database (the real
schema: clusters, cost_intervals, cluster_events, managed_jobs) and its kept-copies directory
(the real files, through keptlogs.store's records), as the daemon would have left them after
months of use; the daemon is then started on it. Its own start-up prunes what it bounds (the
newest 20,000 events). Run through `scripts/bench --only cost_ledger`.
"""

from __future__ import annotations

import dataclasses
import json
import os
import random
import shutil
import sqlite3
import statistics
import sys
import time
from pathlib import Path
from typing import Any

SCALES = tuple(int(n) for n in os.environ.get(
    "CLUSTERD_BENCH_COST_SCALES", "1000,10000").split(","))
LIVE = 300
JOBS_PER_CLUSTER = 10
HISTORY_DAYS = 90
ROUNDS = int(os.environ.get("CLUSTERD_BENCH_COST_ROUNDS", "10"))
STATUS_CALLS = 30
PREFIX = "hist-"
OWNER_BASE = 1_000_000
DAY = 86400.0
# (provider, infra, instance type, node $/h, disk $/h, source) the torn-down clusters ran on.
PLACES = (
    ("aws", "aws/us-east-1/us-east-1a", "m5.large", 0.096, 0.0281, "catalog on-demand"),
    ("aws", "aws/us-west-2/us-west-2b", "p3.2xlarge", 3.06, 0.0281, "catalog on-demand"),
    ("aws", "aws/us-east-1/us-east-1c", "g5.xlarge", 0.402, 0.0281,
     "catalog spot (estimate)"),
    ("kubernetes", "kubernetes/ctx-a", None, 0.188, 0.0035, "kubernetes.pricing"),
    ("ssh", "ssh/rack", None, 0.5, 0.0, "ssh pool rack price_per_hour"),
    ("local", "local", None, 0.0, 0.0, "local (free)"),
)
LIVE_PLACE = ("loadtest", "loadtest/mem", "m.test", 0.5, 0.0281, "bench")
HOW_MEASURED = (
    "`scripts/bench --only cost_ledger` (scripts/bench_cost.py). A generator writes months of "
    "history into a stopped daemon's state database (the real schema: cost_intervals, "
    "cluster_events, clusters, managed_jobs) and kept-copies directory (cluster.json and "
    "jobs.json per incarnation): 10,000 clusters over 90 days, 10 jobs each (100,000), a "
    "third stopped and started once, a tenth managed jobs' attempts, 300 live on the "
    "in-memory load-test provider; every torn-down cluster's jobs kept "
    "(CLUSTERD_KEPT_HISTORY=10000: the report's worst case). The daemon starts on it "
    "(pruning events to its bound, settling every torn-down cluster's split in the "
    "background) and is timed over its socket: one first report at once (it waits for the "
    "settling; `first_report_ms`), then 10 interleaved rounds "
    "of `cost_report` for 30 and 90 days as clusterctl asks (the 100 costliest listed, "
    "totals over all; median, p95) and for 90 days of the costliest cluster alone (as a "
    "dashboard cluster page asks), 5 of 90 days with every cluster listed (`--limit 0`), "
    "30 `status` calls in columns. The baseline is the same run on 1,000 clusters (10,000 "
    "jobs, the same 300 live); the machine is shared, so compare ratios. RSS is VmRSS of "
    "the daemon: the baseline before any history, the value once loaded, and after the 30 "
    "reports. Before settled splits and the limit (same machine, daemon at f4d882a): "
    "1,052 ms (30 days) and 2,179 ms (90 days, 6.3 MiB) at 10,000 clusters, 208 and 509 ms "
    "at 1,000; RSS 129 MiB loaded, 206 MiB after 20 reports.")
_INTERVAL = ("INSERT INTO cost_intervals (cluster, incarnation, cloud_name, provider, infra,"
             " instance_type, nodes, kind, started_at, ended_at, node_price_per_hour,"
             " disk_price_per_hour, source, owner) VALUES"
             " (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_EVENT = ("INSERT INTO cluster_events (ts, cluster, kind, from_status, to_status, reason)"
          " VALUES (?, ?, 'status', ?, ?, 'written by the cost benchmark')")


@dataclasses.dataclass
class Incarnation:
    """One cluster's life as the generator made it."""

    name: str
    created_at: float
    up_at: float
    ended_at: float | None  # None: live
    nodes: int
    place: tuple[str, str, str | None, float, float, str]
    owner: str | None
    intervals: list[tuple[str, float, float | None]]  # (kind, start, end)


def _life(rng: random.Random, index: int, count: int, now: float) -> Incarnation:
    live = index >= count - LIVE
    name = f"{PREFIX}{index:05d}"
    nodes = rng.choice((1, 1, 1, 2, 4))
    if live:
        created = now - rng.uniform(0.1, 20) * DAY
        place = LIVE_PLACE
    else:
        created = now - rng.uniform(0.05, HISTORY_DAYS) * DAY
        place = rng.choice(PLACES)
    up_at = created + rng.uniform(60, 600)  # provisioning and setup
    # Lives of minutes to days; a third stop once and start again (disks paid meanwhile).
    running = min(rng.lognormvariate(1.5, 1.2) * 3600, 10 * DAY)
    spans: list[tuple[str, float, float | None]] = [("running", created, up_at + running)]
    if not live and rng.random() < 0.33:
        end_run = spans[-1][2]
        assert end_run is not None
        stopped_until = end_run + rng.uniform(1, 48) * 3600
        spans += [("stopped", end_run, stopped_until),
                  ("running", stopped_until, stopped_until + rng.uniform(0.5, 12) * 3600)]
    # A torn-down cluster ended when its last stretch did (never in the future); a live
    # one's (only) stretch is open.
    last_end = spans[-1][2]
    assert last_end is not None
    ended: float | None = None if live else min(last_end, now - 60)
    limit = now if ended is None else ended
    spans = [(k, s, None if live else min(e or limit, limit)) for k, s, e in spans
             if s < limit]
    # A tenth are managed jobs' clusters, two attempts each (ids clear of real ones).
    owner = f"managed-job:{OWNER_BASE + index // 2}" if index % 10 in (0, 1) else None
    return Incarnation(name, created, up_at, ended, nodes, place, owner, spans)


def _jobs(rng: random.Random, life: Incarnation, now: float) -> dict[str, Any]:
    """JOBS_PER_CLUSTER jobs in the cluster's UP time, as jobs.json holds them."""
    from clusterd.keptlogs.store import KeptJob

    running = [(s, e if e is not None else now) for k, s, e in life.intervals if k == "running"]
    jobs: dict[str, Any] = {}
    slot_count = JOBS_PER_CLUSTER
    for job_id in range(1, slot_count + 1):
        start, end = running[(job_id - 1) * len(running) // slot_count]
        start = max(start, life.up_at)
        width = max(0.0, end - start) / slot_count
        slot = start + width * ((job_id - 1) % slot_count)
        begin = slot + rng.uniform(0, width / 4)
        finish: float | None = begin + rng.uniform(width / 4, width * 3 / 4)
        last = life.ended_at is None and job_id == slot_count
        if last:
            finish = None
        jobs[str(job_id)] = KeptJob(
            job_id, name=f"job-{job_id}", status="RUNNING" if last else "SUCCEEDED",
            submitted_at=begin, ended_at=finish, complete=not last, started_at=begin,
            num_nodes=rng.randint(1, life.nodes)).to_json()
    return jobs


def _private_json(path: Path, data: Any) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)


def _keep(kept_root: Path, life: Incarnation, jobs: dict[str, Any]) -> None:
    """The incarnation's kept copies' records (no logs: the report reads none)."""
    from clusterd.keptlogs.store import CLUSTER_FILE, JOBS_FILE, KeptCluster

    row = KeptCluster(life.name, life.place[0], life.place[1], life.created_at,
                      launched_at=life.up_at, status="UP" if life.ended_at is None
                      else "TERMINATED", torn_down_at=life.ended_at)
    directory = kept_root / row.key
    directory.mkdir(mode=0o700)
    _private_json(directory / CLUSTER_FILE, dataclasses.asdict(row))
    _private_json(directory / JOBS_FILE, jobs)


def forget_history(state_dir: Path) -> None:
    """What a previous write_history left, gone (the database's daemon is stopped)."""
    db = sqlite3.connect(state_dir / "state.db")
    try:
        with db:
            for table, column in (("cost_intervals", "cluster"), ("cluster_events", "cluster"),
                                  ("clusters", "name"), ("managed_jobs", "cluster")):
                db.execute(f"DELETE FROM {table} WHERE {column} GLOB ?", [f"{PREFIX}*"])
    finally:
        db.close()
    for directory in (state_dir / "kept-logs").glob(f"{PREFIX}*@*"):
        shutil.rmtree(directory)


def write_history(state_dir: Path, count: int, now: float, seed: int = 39) -> dict[str, int]:
    """`count` clusters' history (the last LIVE of them live), replacing any written before.
    Returns how many rows of each kind went in."""
    from bench_bed import insert_records

    from clusterd.managed.store import SubmittedTask
    from clusterd.state.db import dumps

    forget_history(state_dir)
    rng = random.Random(seed)
    lives = [_life(rng, i, count, now) for i in range(count)]
    kept_root = state_dir / "kept-logs"
    kept_root.mkdir(mode=0o700, exist_ok=True)
    events: list[tuple[float, str, str | None, str]] = []
    intervals = []
    jobs = 0
    for life in lives:
        price = life.place
        for kind, start, end in life.intervals:
            intervals.append((life.name, life.created_at, f"{life.name}-x", price[0], price[1],
                              price[2], life.nodes, kind, start, end, price[3], price[4],
                              price[5], life.owner))
        events += [(life.created_at, life.name, None, "INIT"),
                   (life.up_at, life.name, "INIT", "UP")]
        if life.ended_at is not None:
            events.append((life.ended_at, life.name, "UP", "TERMINATED"))
        listed = _jobs(rng, life, now)
        jobs += len(listed)
        _keep(kept_root, life, listed)
    events.sort(key=lambda event: event[0])
    owners = sorted({int(life.owner.rsplit(":", 1)[1]) for life in lives if life.owner})
    task = dumps(SubmittedTask(command="python train.py").to_json())
    db = sqlite3.connect(state_dir / "state.db")
    try:
        with db:
            db.executemany(_INTERVAL, intervals)
            db.executemany(_EVENT, events)
            db.executemany(
                "INSERT INTO managed_jobs (id, name, task, status, cluster, task_id,"
                " submitted_at, status_updated_at) VALUES (?, ?, ?, 'SUCCEEDED', ?, ?, ?, ?)",
                [(job, f"train-{job}", task, f"{PREFIX}mj-{job}", f"t{job}", now, now)
                 for job in owners])
    finally:
        db.close()
    live = [life for life in lives if life.ended_at is None]
    insert_records(state_dir / "state.db", "loadtest", "UP",
                   [(f"{life.name}-x", {"infra": "loadtest/mem"}, {"infra": "loadtest/mem"},
                     {"provider": {"nodes": life.nodes}}) for life in live],
                   created=[life.created_at for life in live],
                   nodes=[life.nodes for life in live])
    return {"clusters": count, "intervals": len(intervals), "events": len(events),
            "jobs": jobs, "managed_jobs": len(owners), "live": len(live)}


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit(f"no VmRSS for {pid}")


@dataclasses.dataclass
class Measured:
    # Per series (30 and 90 days as clusterctl asks, ALL: 90 days with every cluster listed):
    report_ms: dict[int, list[float]]  # each round's ms
    report_bytes: dict[int, int]
    clusters: dict[int, tuple[int, int]]  # (listed, in the window)
    status_ms: list[float]
    rss_loaded: float
    rss_after: float  # after the 3 x ROUNDS reports (30 days, 90 days, one cluster)
    first_ms: float  # the first report, which waits for the start's settling


ALL = 0  # the series of 90 days, --limit 0
ONE = -1  # the series of 90 days of one cluster (a dashboard cluster page's ask)


def _report(client: Any, days: int, limit: int, into: Measured, series: int,
            cluster: str = "") -> None:
    from clusterctl import protocol

    started = time.perf_counter()
    report = client.call(protocol.CostReportArgs(days=days, limit=limit, cluster=cluster))
    into.report_ms.setdefault(series, []).append((time.perf_counter() - started) * 1000)
    into.report_bytes[series] = len(protocol.encode_frame(report))
    into.clusters[series] = (len(report["clusters"]),
                             len(report["clusters"]) + report["others"]["clusters"])


def _measure(bench: Any) -> Measured:
    from clusterctl import Client, StatusArgs, protocol

    assert bench.daemon is not None
    with Client(bench.socket, autostart=False) as client:
        client.call(StatusArgs(refresh=True))  # the live clusters settled by one refresh
        got = Measured({}, {}, {}, [], rss_mib(bench.daemon.pid), 0.0, 0.0)
        # The first report waits for the start's settling of every torn-down cluster's
        # split (a daemon with this history has done so already, hourly): timed apart.
        started = time.perf_counter()
        first = client.call(protocol.CostReportArgs(days=90))
        got.first_ms = (time.perf_counter() - started) * 1000
        costliest = first["clusters"][0]["name"]
        for _ in range(STATUS_CALLS):
            started = time.perf_counter()
            reply = client.call(StatusArgs(columns=True))
            got.status_ms.append((time.perf_counter() - started) * 1000)
            if len(reply["clusters"]["rows"]) < LIVE:
                raise SystemExit("status lost clusters")
        for _ in range(ROUNDS):
            for days in (30, 90):
                _report(client, days, 100, got, days)
            _report(client, 90, 100, got, ONE, cluster=costliest)
        got.rss_after = rss_mib(bench.daemon.pid)
        for _ in range(max(1, ROUNDS // 2)):
            _report(client, 90, 0, got, ALL)
    return got


def bench_cost_ledger(bench: Any) -> None:
    from benchmarks import percentile

    small, large = SCALES
    print(f"(l) the cost ledger with {small:,} and {large:,} clusters of history "
          f"({JOBS_PER_CLUSTER} jobs each, {LIVE} live)", file=sys.stderr)
    bench.notes["cost_"] = HOW_MEASURED
    state_dir = bench.root / "state" / "clusterd"
    env = {"CLUSTERD_TEST_PROVIDERS": "loadtest",
           # Every torn-down cluster's jobs kept: the report's worst case (default 500).
           "CLUSTERD_KEPT_HISTORY": str(max(SCALES))}
    bench._restart_daemon(env, lambda: forget_history(state_dir))
    assert bench.daemon is not None
    rss_before = rss_mib(bench.daemon.pid)
    results: dict[int, tuple[Measured, dict[str, int]]] = {}
    try:
        for scale in SCALES:
            written: dict[str, int] = {}

            def write(count: int = scale, into: dict[str, int] = written) -> None:
                into.update(write_history(state_dir, count, time.time()))

            bench._restart_daemon(env, write)
            results[scale] = (_measure(bench), written)
    finally:
        bench._restart_daemon({}, lambda: forget_history(state_dir))
    base, _ = results[small]
    ours, counts = results[large]
    for series, label in ((30, "cost_report_p50"), (90, "cost_report_90d_p50"),
                          (ONE, "cost_report_90d_one_cluster_p50"),
                          (ALL, "cost_report_90d_all_p50")):
        p50 = statistics.median(ours.report_ms[series])
        listed, in_window = ours.clusters[series]
        bench.record(label, p50, "ms", baseline=statistics.median(base.report_ms[series]),
                     baseline_name=f"the same with {small:,} clusters",
                     target="" if series in (ALL, ONE) else "≤ 200 ms",
                     ok=None if series in (ALL, ONE) else p50 <= 200,
                     p95_ms=round(percentile(ours.report_ms[series], 95), 1),
                     baseline_p95_ms=round(percentile(base.report_ms[series], 95), 1),
                     clusters=counts["clusters"], jobs=counts["jobs"],
                     intervals=counts["intervals"], rounds=len(ours.report_ms[series]),
                     in_window=in_window, listed=listed,
                     report_kib=round(ours.report_bytes[series] / 1024),
                     **({"first_report_ms": round(ours.first_ms)} if series == 90 else {}))
    p50 = statistics.median(ours.status_ms)
    bench.record("cost_status_300_live_p50", p50, "ms",
                 baseline=statistics.median(base.status_ms),
                 baseline_name=f"the same with {small:,} clusters of history",
                 p95_ms=round(percentile(ours.status_ms, 95), 2), live=LIVE,
                 clusters=counts["clusters"])
    bench.record("cost_daemon_rss", ours.rss_loaded, "MiB", baseline=rss_before,
                 baseline_name="before the history was loaded",
                 after_reports_mib=round(ours.rss_after, 1),
                 small_loaded_mib=round(base.rss_loaded, 1),
                 small_after_reports_mib=round(base.rss_after, 1), reports=3 * ROUNDS,
                 clusters=counts["clusters"])
