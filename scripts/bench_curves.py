"""Cost curves: how clusterd's costs grow with the work it holds (`scripts/bench --only
curves_clusters,curves_queue,curves_logs,curves_failover`).

Each figure is measured at each size, recorded as a row per size, and drawn as a PNG chart
in the run's output directory (matplotlib). Every curve row says how it grows from the size
before (`growth`: the exponent k of value ~ size^k between the two sizes; 1 is linear):
anything clearly above 1 is a finding.

- clusters: status latency (over the socket, and the CLI's wall time), daemon RSS and one
  refresh cycle at 10, 100, 1,000 and 10,000 clusters of the in-memory load-test provider;
- queue: `clusterctl queue` at 200, 2,000 and 20,000 jobs on one local cluster (the jobs wait
  behind one that holds the node, so none of them has to run);
- logs: `clusterctl logs --tail 1000` on a 1 GB log, beside `tail -n 1000` of the same file;
- failover: the engine's decision time per attempt when a launch walks through 10, 100 and
  1,000 zones, all out of capacity (the launch fails having made nothing).
"""

from __future__ import annotations

import itertools
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

CLUSTER_SIZES = tuple(int(n) for n in os.environ.get(
    "CLUSTERD_BENCH_CLUSTER_SIZES", "10,100,1000,10000").split(","))
QUEUE_SIZES = tuple(int(n) for n in os.environ.get(
    "CLUSTERD_BENCH_QUEUE_SIZES", "200,2000,20000").split(","))
FAILOVER_SIZES = (10, 100, 1000)
LOG_BYTES = int(os.environ.get("CLUSTERD_BENCH_LOG_BYTES", str(10**9)))
QUEUE_CLUSTER = "curves-q"


def _growth(sizes: list[int], values: list[float]) -> list[float | None]:
    """The exponent of each step: log(v2/v1) / log(n2/n1)."""
    out: list[float | None] = [None]
    for (n1, v1), (n2, v2) in itertools.pairwise(zip(sizes, values, strict=True)):
        out.append(round(math.log(v2 / v1) / math.log(n2 / n1), 2)
                    if v1 > 0 and v2 > 0 else None)
    return out


def _record_curve(bench: Any, name: str, unit: str, sizes: list[int], values: list[float],
                  size_name: str, targets: dict[int, tuple[str, bool]] | None = None,
                  **per_size: list[Any]) -> None:
    rows = zip(sizes, values, _growth(sizes, values), strict=True)
    for index, (size, value, growth) in enumerate(rows):
        target, ok = (targets or {}).get(size, ("", None))
        extra = {key: column[index] for key, column in per_size.items()}
        bench.record(f"{name}_{size}", value, unit, target=target, ok=ok,
                     **{size_name: size, "growth": growth, **extra})


def _chart(bench: Any, stem: str, title: str, xlabel: str,
           series: list[tuple[str, list[int], list[float], str]]) -> None:
    """One PNG with a line per series (label, sizes, values, unit); log-log axes, so a
    straight line of slope 1 is linear growth. Series of a second unit get a right axis
    (linear, from zero)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, left = plt.subplots(figsize=(7, 4.2), dpi=110)
    units = list(dict.fromkeys(unit for *_, unit in series))
    axes = {units[0]: left}
    if len(units) > 1:
        axes[units[1]] = left.twinx()
    for number, (label, sizes, values, unit) in enumerate(series):
        axis = axes[unit]
        axis.plot(sizes, values, marker="o", color=f"C{number}", label=f"{label} ({unit})")
        axis.set_ylabel(unit)
        if axis is left:
            axis.set_yscale("log")
        else:  # memory and the like: from zero, so a flat line looks flat
            axis.set_ylim(bottom=0, top=max(values) * 1.3)
    left.set_xscale("log")
    left.set_xlabel(xlabel)
    left.set_title(title)
    left.grid(True, which="both", alpha=0.3)
    handles = [h for axis in axes.values() for h in axis.get_legend_handles_labels()[0]]
    left.legend(handles, [str(h.get_label()) for h in handles], loc="upper left",
                fontsize="small")
    figure.tight_layout()
    figure.savefig(bench.out / f"{stem}.png")
    plt.close(figure)


def _wall(bench: Any, *args: str, runs: int = 5) -> float:
    """Median seconds of `clusterctl ARGS` (output thrown away)."""
    from benchmarks import CLUSTERCTL

    walls = []
    for _ in range(runs):
        started = time.perf_counter()
        done = subprocess.run([CLUSTERCTL, *args], env=bench.env, stdout=subprocess.DEVNULL,
                              stderr=subprocess.PIPE, timeout=600)
        walls.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"clusterctl {' '.join(args)} failed: {done.stderr[-500:]!r}")
    return statistics.median(walls)


def bench_curves_clusters(bench: Any) -> None:
    print(f"(q) cost curve: clusters {CLUSTER_SIZES}: status, RSS, refresh cycle",
          file=sys.stderr)
    import psutil
    from benchmarks import percentile

    from clusterctl import Client, StatusArgs

    sizes: list[int] = []
    call_p50, call_p99, columns_p50, cli, rss, cycle = [], [], [], [], [], []
    for size in CLUSTER_SIZES:
        bench.loadtest_clusters(size)
        cycle.append(bench.refresh_cycle())
        with Client(bench.socket, autostart=False) as client:
            latencies, in_columns = [], []
            for _ in range(50):  # maps and columns in turn, so both see the same machine
                started = time.perf_counter()
                reply = client.call(StatusArgs())
                latencies.append(time.perf_counter() - started)
                started = time.perf_counter()
                table = client.call(StatusArgs(columns=True))
                in_columns.append(time.perf_counter() - started)
            if len(reply["clusters"]) < size or len(table["clusters"]["rows"]) < size:
                raise SystemExit(f"status shows {len(reply['clusters'])} of {size} clusters")
        sizes.append(size)
        call_p50.append(percentile(latencies, 50) * 1000)
        call_p99.append(percentile(latencies, 99) * 1000)
        columns_p50.append(percentile(in_columns, 50) * 1000)
        cli.append(_wall(bench, "status") * 1000)
        rss.append(psutil.Process(bench.daemon.pid).memory_info().rss / 2**20)
        print(f"  {size} clusters: status call p50 {call_p50[-1]:.2f} ms (in columns "
              f"{columns_p50[-1]:.2f} ms), CLI "
              f"{cli[-1]:.1f} ms, RSS {rss[-1]:.0f} MiB, refresh {cycle[-1]:.2f} s",
              file=sys.stderr)
    biggest = max(sizes)
    _record_curve(bench, "curve_status_call_p50", "ms", sizes, call_p50, "clusters",
                  {biggest: ("≤ 50 ms", call_p50[-1] <= 50)},
                  p99_ms=[round(v, 2) for v in call_p99])
    _record_curve(bench, "curve_status_columns_p50", "ms", sizes, columns_p50, "clusters",
                  {biggest: ("≤ 50 ms", columns_p50[-1] <= 50)})
    _record_curve(bench, "curve_status_cli", "ms", sizes, cli, "clusters")
    _record_curve(bench, "curve_daemon_rss", "MiB", sizes, rss, "clusters",
                  {10000: ("≤ 300 MB", rss[-1] * 2**20 <= 300e6)})
    _record_curve(bench, "curve_refresh_cycle", "s", sizes, cycle, "clusters",
                  {10000: ("≤ 10 s", cycle[-1] <= 10)})
    _chart(bench, "curve_clusters", "status and memory as clusters grow", "clusters",
           [("status over the socket, p50", sizes, call_p50, "ms"),
            ("the same in columns, p50", sizes, columns_p50, "ms"),
            ("clusterctl status, wall", sizes, cli, "ms"),
            ("daemon RSS", sizes, rss, "MiB")])
    _chart(bench, "curve_refresh", "one refresh cycle as clusters grow", "clusters",
           [("refresh cycle", sizes, cycle, "s")])


def _submit(bench: Any, count: int, **fields: Any) -> None:
    from clusterctl import Client, ExecArgs

    with Client(bench.socket, autostart=False) as client:
        for start in range(0, count, 100):
            batch = [ExecArgs(cluster=QUEUE_CLUSTER, command="true", detach=True, **fields)
                     for _ in range(min(100, count - start))]
            for result in client.call_many(batch):
                if isinstance(result, Exception):
                    raise SystemExit(f"submitting jobs failed: {result}")


def bench_curves_queue(bench: Any) -> None:
    print(f"(r) cost curve: queue of {QUEUE_SIZES} jobs", file=sys.stderr)
    cpus = str(os.cpu_count() or 1)
    done = bench.ctl("launch", "-c", QUEUE_CLUSTER, "--cpus", cpus, "-d", "--", "sleep 86400")
    if done.returncode != 0:
        raise SystemExit(f"launch {QUEUE_CLUSTER} failed: {done.stderr}")
    try:
        sizes: list[int] = []
        walls: list[float] = []
        submit_rates: list[float] = []
        have = 1
        for size in QUEUE_SIZES:
            started = time.monotonic()
            _submit(bench, size - have, cpus=cpus)  # each needs the node the first holds
            submit_rates.append(round((size - have) / (time.monotonic() - started), 1))
            have = size
            listed = len(json.loads(bench.ctl("queue", QUEUE_CLUSTER, "--json").stdout))
            if listed < size:
                raise SystemExit(f"queue lists {listed} of {size} jobs")
            sizes.append(size)
            walls.append(_wall(bench, "queue", QUEUE_CLUSTER) * 1000)
            print(f"  {size} jobs: queue {walls[-1]:.1f} ms (submitted at "
                  f"{submit_rates[-1]}/s)", file=sys.stderr)
        _record_curve(bench, "curve_queue_cli", "ms", sizes, walls, "jobs",
                      submitted_per_s=submit_rates)
        _chart(bench, "curve_queue", "clusterctl queue as a cluster's jobs grow", "jobs",
               [("clusterctl queue, wall", sizes, walls, "ms")])
    finally:
        bench.ctl("down", "-y", "--purge", QUEUE_CLUSTER)


def bench_curves_logs(bench: Any) -> None:
    print(f"(s) logs --tail 1000 of a {LOG_BYTES / 1e9:.1f} GB log vs tail -n 1000",
          file=sys.stderr)
    from benchmarks import CLUSTER

    # Lines of 100 bytes, numbered, so the tail's content can be checked.
    writer = (f"python3 -c \"import sys; w = sys.stdout.write\n"
              f"for i in range({LOG_BYTES // 100}): w('%099d\\n' % i)\"")
    started = time.monotonic()
    done = bench.ctl("exec", CLUSTER, "--", writer)
    written_s = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"writing the log failed: {done.stderr[-500:]}")
    job = max(json.loads(bench.ctl("queue", CLUSTER, "--json").stdout),
              key=lambda j: j["job_id"])
    log_files = sorted(Path(job["log_dir"]).rglob("*.log"), key=lambda p: p.stat().st_size)
    if not log_files or log_files[-1].stat().st_size < LOG_BYTES:
        raise SystemExit(f"no log of {LOG_BYTES} bytes in {job['log_dir']}")
    biggest = log_files[-1]
    tail = bench.ctl("logs", CLUSTER, str(job["job_id"]), "--no-follow", "--tail", "1000")
    last = tail.stdout.splitlines()[-1] if tail.stdout else ""
    if not last.endswith(f"{LOG_BYTES // 100 - 1:099d}"):
        raise SystemExit(f"logs --tail shows {last[-120:]!r} last")
    ours = _wall(bench, "logs", CLUSTER, str(job["job_id"]), "--no-follow", "--tail", "1000",
                 runs=7)
    bases = []
    for _ in range(7):
        begun = time.perf_counter()
        subprocess.run(["tail", "-n", "1000", str(biggest)], stdout=subprocess.DEVNULL,
                       check=True)
        bases.append(time.perf_counter() - begun)
    bench.record("logs_tail_1000_of_1gb", ours * 1000, "ms",
                 baseline=statistics.median(bases) * 1000,
                 baseline_name="tail -n 1000 of the file", log_bytes=biggest.stat().st_size,
                 written_mb_per_s=round(LOG_BYTES / 1e6 / written_s, 1))


def bench_curves_failover(bench: Any) -> None:
    print(f"(t) cost curve: failover through {FAILOVER_SIZES} zones, all out of capacity",
          file=sys.stderr)
    from clusterctl import Client, PingArgs

    sizes: list[int] = []
    p50s, maxes, walls = [], [], []
    for size in FAILOVER_SIZES:
        bench._restart_daemon(extra={"CLUSTERD_TEST_PROVIDERS": "loadtest",
                                     "CLUSTERD_LOADTEST_ZONES": str(size),
                                     "CLUSTERD_LOADTEST_STOCKOUT": "1"},
                              before=lambda: None)
        bench.loadtest = -1  # its clusters are still recorded; loadtest_clusters re-counts
        name = f"fo-{size}"
        started = time.monotonic()
        done = bench.ctl("launch", "-c", name, "--infra", "loadtest", "--", "true")
        wall = time.monotonic() - started
        if done.returncode == 0 or "RESOURCES_UNAVAILABLE" not in done.stderr:
            raise SystemExit(f"launch through {size} zones out of capacity did not fail as "
                             f"it should: {done.stderr[-800:]}")
        with Client(bench.socket, autostart=False) as client:
            stats = client.call(PingArgs())["provision"]
        if stats["attempts"] != size:
            raise SystemExit(f"{stats['attempts']} attempts for {size} zones")
        sizes.append(size)
        p50s.append(float(stats["decision_ms_p50"]))
        maxes.append(float(stats["decision_ms_max"]))
        walls.append(wall)
        print(f"  {size} zones: decision p50 {p50s[-1]:.3f} ms, max {maxes[-1]:.3f} ms, "
              f"launch {wall:.2f} s", file=sys.stderr)
    _record_curve(bench, "curve_failover_decision_p50", "ms", sizes, p50s, "candidates",
                  {1000: ("≤ 20 ms per attempt", maxes[-1] <= 20)},
                  max_ms=maxes, launch_s=[round(w, 2) for w in walls])
    _chart(bench, "curve_failover", "failover: the engine's time per attempt", "candidates",
           [("decision per attempt, p50", sizes, p50s, "ms"),
            ("decision per attempt, max", sizes, maxes, "ms")])
    bench._restart_daemon(extra={}, before=lambda: None)
