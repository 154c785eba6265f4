"""clusterd's benchmarks, measured side by side in one run (this machine is shared and noisy, so
every number comes with a baseline taken in the same run, and the ratio is what to compare).

Run through `scripts/bench` (which uses the project's .venv). It starts a daemon of its own in
a temporary directory, launches a local cluster `bench`, measures, and tears everything down.

    scripts/bench                 # all, as a table
    scripts/bench --json          # machine-readable
    scripts/bench --only status,exec
    scripts/bench --write-docs    # and update docs/benchmarks.md (rows of other runs kept)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_aws import (
    bench_aws_launch,
    bench_aws_refresh,
    bench_aws_security_groups,
    bench_failover,
)
from bench_bed import insert_records
from bench_client import bench_installed, bench_queue, bench_queue_drain
from bench_cost import bench_cost_ledger
from bench_curves import (
    bench_curves_clusters,
    bench_curves_failover,
    bench_curves_logs,
    bench_curves_queue,
)
from bench_dashboard import bench_dashboard_logs, bench_dashboard_page
from bench_k8s import bench_k8s_bed, bench_k8s_launch, bench_k8s_refresh
from bench_keptlogs import bench_kept_logs
from bench_managed import bench_managed
from bench_ssh import bench_ssh_concurrency, bench_ssh_exec, bench_ssh_throughput
from bench_storage import bench_storage

VENV_BIN = Path(sys.executable).parent
CLUSTERCTL = str(VENV_BIN / "clusterctl")
CLUSTER = "bench"
SSH_CLUSTER = "bench-ssh"
TESTBED = Path(__file__).resolve().parent / "testbed"


def percentile(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    index = min(len(ordered) - 1, max(0, round(q / 100 * (len(ordered) - 1))))
    return ordered[index]


class Bench:
    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="cdb-", dir="/tmp"))
        runtime = self.root / "rt"
        runtime.mkdir(mode=0o700)
        # Without PYTHONDONTWRITEBYTECODE: an installed clusterctl has its bytecode cached,
        # and a shell that sets it made every client row ~40 ms slower (compiled each run).
        self.env = {k: v for k, v in os.environ.items()
                    if not k.startswith(("CLUSTERD_", "XDG_")) and k != "PYTHONDONTWRITEBYTECODE"}
        home = self.root / "home"
        home.mkdir()
        # A home of its own too: ssh clusters add an Include to ~/.ssh/config.
        self.env.update(XDG_RUNTIME_DIR=str(runtime), XDG_STATE_HOME=str(self.root / "state"),
                        XDG_CONFIG_HOME=str(self.root / "config"), CLUSTERD_NO_AUTOSTART="1",
                        CLUSTERD_LOG_LEVEL="warning", HOME=str(home))
        self.socket = runtime / "clusterd" / "clusterd.sock"
        self.daemon: subprocess.Popen[bytes] | None = None
        self.rows: list[dict[str, Any]] = []
        self.out = self.root / "out"  # charts and data a run keeps (main sets --out)
        self.bed: Path | None = None
        self.loadtest = 0  # load-test records in the daemon (see loadtest_clusters)
        # How a benchmark's rows were measured, for the page (by the rows' name prefix).
        self.notes: dict[str, str] = {}

    # -- set-up ---------------------------------------------------------------------------

    def start(self) -> None:
        self._spawn_daemon({})
        result = self.ctl("launch", "-c", CLUSTER, "--", "true")
        if result.returncode != 0:
            raise SystemExit(f"launch failed: {result.stderr}")

    def _spawn_daemon(self, extra: dict[str, str]) -> None:
        """Start clusterd (with `extra` environment) and wait until its socket answers."""
        log_path = self.root / "daemon.log"
        with open(log_path, "ab") as log:
            self.daemon = subprocess.Popen([sys.executable, "-m", "clusterd"],
                                           env={**self.env, **extra}, stdout=log, stderr=log,
                                           start_new_session=True, cwd="/")
        deadline = time.monotonic() + 30
        while not self._connectable():
            if time.monotonic() > deadline or self.daemon.poll() is not None:
                raise SystemExit(f"clusterd did not start; see {log_path}")
            time.sleep(0.05)

    def _restart_daemon(self, extra: dict[str, str], before: Callable[[], None]) -> None:
        assert self.daemon is not None
        self.daemon.send_signal(signal.SIGTERM)
        self.daemon.wait(30)
        before()
        self._spawn_daemon(extra)

    def ssh_cluster(self) -> list[dict[str, Any]]:
        """A two-node cluster on a test bed of real sshd hosts (made on first use)."""
        if self.bed is None:
            self.bed = self.root / "bed"
            pools = self.root / "config" / "clusterd" / "ssh_node_pools.yaml"
            up = subprocess.run([sys.executable, str(TESTBED), "up", "2", "--dir", str(self.bed),
                                 "--prefix", "cdb", "--port", "2422", "--pools-file", str(pools)],
                                capture_output=True, text=True)
            if up.returncode != 0:
                raise SystemExit(f"testbed failed: {up.stderr}")
            result = self.ctl("launch", "-c", SSH_CLUSTER, "--infra", "ssh/testbed",
                              "--num-nodes", "2", "--", "true")
            if result.returncode != 0:
                raise SystemExit(f"ssh launch failed: {result.stderr}")
        hosts: list[dict[str, Any]] = json.loads((self.bed / "hosts.json").read_text())
        return hosts

    def stop(self) -> None:
        if self.daemon is not None and self.daemon.poll() is None:
            self.ctl("down", "-y", "--purge", CLUSTER)
            if self.bed is not None:
                self.ctl("down", "-y", "--purge", SSH_CLUSTER)
            self.daemon.send_signal(signal.SIGTERM)
            try:
                self.daemon.wait(20)
            except subprocess.TimeoutExpired:
                self.daemon.kill()
        if self.bed is not None:
            subprocess.run([sys.executable, str(TESTBED), "down", "--dir", str(self.bed)],
                           capture_output=True)
        if os.environ.get("CLUSTERD_BENCH_KEEP"):
            print(f"kept {self.root}", file=sys.stderr)
        else:
            shutil.rmtree(self.root, ignore_errors=True)

    def _connectable(self) -> bool:
        with socket.socket(socket.AF_UNIX) as sock:
            try:
                sock.connect(str(self.socket))
                return True
            except OSError:
                return False

    def loadtest_clusters(self, count: int) -> None:
        """`count` clusters of the in-memory load-test provider: records go straight into the
        database (as a crash would leave them to be reconciled; any made before are replaced),
        the daemon is restarted with the provider switched on, and one refresh settles them."""
        if self.loadtest == count:
            return
        db_path = self.root / "state" / "clusterd" / "state.db"

        def replace() -> None:
            db = sqlite3.connect(db_path)
            try:
                with db:
                    db.execute("DELETE FROM clusters WHERE provider = 'loadtest'")
            finally:
                db.close()
            insert_records(db_path, "loadtest", "INIT",
                           [(f"load-{i:05d}-x", {"infra": "loadtest/mem"}, {"cpus": 4},
                             {"provider": {"nodes": 1}}) for i in range(count)])

        self._restart_daemon(extra={"CLUSTERD_TEST_PROVIDERS": "loadtest"}, before=replace)
        from clusterctl import Client, StatusArgs

        with Client(self.socket, autostart=False) as client:
            client.call(StatusArgs(refresh=True))
        self.loadtest = count

    def refresh_cycle(self, runs: int = 3) -> float:
        """Median seconds of a whole refresh cycle (forced `runs` times), as the daemon
        timed it."""
        from clusterctl import Client, PingArgs, StatusArgs

        cycles = []
        with Client(self.socket, autostart=False) as client:
            for _ in range(runs):
                client.call(StatusArgs(refresh=True))
                cycles.append(float(client.call(PingArgs())["refresh"]["last_cycle_s"]))
        return statistics.median(cycles)

    def loop_stats(self) -> dict[str, Any]:
        """The daemon's loop watch (ping's `loop`): lag percentiles and what held the loop."""
        from clusterctl import Client, PingArgs

        with Client(self.socket, autostart=False) as client:
            loop: dict[str, Any] = client.call(PingArgs()).get("loop", {})
        return loop

    @staticmethod
    def held(loop: dict[str, Any], before: dict[str, Any] | None = None) -> str:
        """The top of what held the loop (since `before`, if given), for a row's details."""
        earlier = {h["where"]: h["stalls"] for h in (before or {}).get("held", [])}
        rows = [(h["stalls"] - earlier.get(h["where"], 0), h) for h in loop.get("held", [])]
        return "; ".join(f"{n}x up to {h['longest_ms']} ms at {h['where']}"
                         for n, h in sorted(rows, key=lambda r: -r[0])[:3] if n > 0) or "-"

    @staticmethod
    def gc_pauses(loop: dict[str, Any], before: dict[str, Any] | None = None) -> str:
        """The garbage collector's pauses (since `before`), per generation: count, total,
        longest (a longest pause is over the daemon's life, not only since `before`)."""
        earlier = {g["generation"]: g for g in (before or {}).get("gc", {}).get("pauses", [])}
        parts = []
        for g in loop.get("gc", {}).get("pauses", []):
            old = earlier.get(g["generation"], {"collections": 0, "total_ms": 0.0})
            count = g["collections"] - old["collections"]
            if count:
                parts.append(f"gen{g['generation']} {count}x {g['total_ms'] - old['total_ms']:.1f}"
                             f" ms (longest {g['longest_ms']} ms)")
        return ", ".join(parts) or "-"

    def ctl(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([CLUSTERCTL, *args], env=self.env, capture_output=True, text=True,
                              timeout=600)

    def record(self, name: str, value: float, unit: str, *, baseline: float | None = None,
               baseline_name: str = "", target: str = "", ok: bool | None = None,
               **extra: Any) -> None:
        row = {"name": name, "value": round(value, 3), "unit": unit, "target": target,
               "baseline": None if baseline is None else round(baseline, 3),
               "baseline_name": baseline_name,
               "ratio": None if not baseline else round(value / baseline, 2),
               "ok": ok, **extra}
        self.rows.append(row)
        line = f"  {name}: {value:.1f} {unit}"
        if baseline:
            line += f" (baseline {baseline:.1f} {unit}, ratio {value / baseline:.2f})"
        if target:
            line += f" target {target}: {'ok' if ok else 'MISSED'}"
        print(line, file=sys.stderr)

    # -- (a) status wall time ---------------------------------------------------------------

    def bench_status(self, runs: int = 30) -> None:
        print("(a) clusterctl status vs python -c pass", file=sys.stderr)
        ours, base = [], []
        for _ in range(runs):  # interleaved, so both see the same machine
            base.append(_wall([sys.executable, "-c", "pass"], self.env))
            ours.append(_wall([CLUSTERCTL, "status"], self.env))
        p50, b50 = statistics.median(ours) * 1000, statistics.median(base) * 1000
        self.record("status_wall_p50", p50, "ms", baseline=b50, baseline_name="python -c pass",
                    target="≤ 2x python -c pass", ok=p50 <= 2 * b50,
                    p90=round(percentile(ours, 90) * 1000, 1))

    # -- (b) exec latency -------------------------------------------------------------------

    def bench_exec(self, runs: int = 20) -> None:
        print("(b) exec echo hi on the warm cluster vs a fresh Ray driver", file=sys.stderr)
        driver_env, driver_code = self._ray_driver()
        ours_first, ours_exit, ray_first, ray_exit = [], [], [], []
        for _ in range(3):  # warm both paths
            _first_line([CLUSTERCTL, "exec", CLUSTER, "--", "echo hi"], self.env)
            _first_line([sys.executable, "-c", driver_code], driver_env)
        for _ in range(runs):
            first, total = _first_line([CLUSTERCTL, "exec", CLUSTER, "--", "echo hi"], self.env)
            ours_first.append(first)
            ours_exit.append(total)
            first, total = _first_line([sys.executable, "-c", driver_code], driver_env)
            ray_first.append(first)
            ray_exit.append(total)
        ms = 1000
        self.record("exec_first_line_p50", statistics.median(ours_first) * ms, "ms",
                    baseline=statistics.median(ray_first) * ms,
                    baseline_name="python Ray driver: init + placement group + task",
                    target="≤ 40 ms", ok=statistics.median(ours_first) * ms <= 40,
                    p90=round(percentile(ours_first, 90) * ms, 1),
                    baseline_p90=round(percentile(ray_first, 90) * ms, 1))
        self.record("exec_exit_p50", statistics.median(ours_exit) * ms, "ms",
                    baseline=statistics.median(ray_exit) * ms,
                    baseline_name="python Ray driver: init + placement group + task",
                    p90=round(percentile(ours_exit, 90) * ms, 1),
                    baseline_p90=round(percentile(ray_exit, 90) * ms, 1))

    def _ray_driver(self) -> tuple[dict[str, str], str]:
        """Environment and code of a plain Ray driver on the same cluster."""
        db = sqlite3.connect(self.root / "state" / "clusterd" / "state.db")
        try:
            (handle,) = db.execute("SELECT handle FROM clusters WHERE name = ?",
                                   [CLUSTER]).fetchone()
        finally:
            db.close()
        runtime = json.loads(handle)["runtime"]
        run_dir = Path(json.loads(handle)["provider"]["dir"])
        env = dict(self.env)
        env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(run_dir / "ray_token"),
                   RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER="0")
        code = (
            "import ray, subprocess, logging\n"
            "from ray.util.placement_group import placement_group\n"
            "from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy\n"
            f"ray.init(address={runtime['ray_address']!r}, logging_level=logging.ERROR,"
            " log_to_driver=False)\n"
            "pg = placement_group([{'CPU': 0.5}], strategy='STRICT_SPREAD')\n"
            "ray.get(pg.ready())\n"
            "@ray.remote(num_cpus=0)\n"
            "def run(cmd):\n"
            "    return subprocess.run(['bash', '-c', cmd], capture_output=True).stdout\n"
            "s = PlacementGroupSchedulingStrategy(pg, placement_group_bundle_index=0)\n"
            "print(ray.get(run.options(scheduling_strategy=s).remote('echo hi')).decode(),"
            " end='', flush=True)\n"
        )
        return env, code

    # -- (c) control-socket throughput --------------------------------------------------------

    def bench_socket(self, seconds: float = 3.0) -> None:
        print("(c) status requests over the control socket", file=sys.stderr)
        for clients in (1, 8, 64):
            before = self.loop_stats()
            processes = min(clients, max(2, os.cpu_count() or 2))
            per_process = [clients // processes + (1 if i < clients % processes else 0)
                           for i in range(processes)]
            with ProcessPoolExecutor(processes) as pool:
                start_at = time.time() + 0.5
                futures = [pool.submit(_hammer, str(self.socket), n, start_at, seconds)
                           for n in per_process if n]
                latencies = [lat for f in futures for lat in f.result()]
            rate = len(latencies) / seconds
            p99 = percentile(latencies, 99) * 1000
            target = {8: "≥ 5,000/s, p99 ≤ 5 ms", 64: "p99 ≤ 10 ms"}.get(clients, "")
            ok = {8: rate >= 5000 and p99 <= 5, 64: p99 <= 10}.get(clients)
            loop = self.loop_stats()
            self.record(f"status_rps_{clients}_clients", rate, "req/s", target=target, ok=ok,
                        p50_ms=round(percentile(latencies, 50) * 1000, 3),
                        p99_ms=round(p99, 3), loop_lag_p99_ms=loop.get("lag_ms_p99"),
                        loop_held=self.held(loop, before), gc=self.gc_pauses(loop, before))



def _wall(argv: list[str], env: dict[str, str]) -> float:
    started = time.perf_counter()
    subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                   check=True)
    return time.perf_counter() - started


def _first_line(argv: list[str], env: dict[str, str],
                expect: bytes | None = b"hi") -> tuple[float, float]:
    """Seconds to the first line on stdout, and to exit."""
    started = time.perf_counter()
    process = subprocess.Popen(argv, env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.DEVNULL)
    assert process.stdout is not None
    line = process.stdout.readline()
    first = time.perf_counter() - started
    process.stdout.read()
    if process.wait() != 0 or (expect is not None and line.strip() != expect):
        raise SystemExit(f"{argv[0]} failed: {line!r}")
    return first, time.perf_counter() - started


def _hammer(socket_path: str, clients: int, start_at: float, seconds: float) -> list[float]:
    """`clients` connections in threads, each sending status requests back to back."""
    from clusterctl import protocol

    latencies: list[list[float]] = [[] for _ in range(clients)]

    def one(index: int) -> None:
        sock = socket.socket(socket.AF_UNIX)
        sock.connect(socket_path)
        decoder = protocol.FrameDecoder()

        def exchange(message: dict[str, Any]) -> dict[str, Any]:
            sock.sendall(protocol.encode_frame(message))
            while (reply := decoder.next_message()) is None:
                decoder.feed(sock.recv(65536))
            return reply

        exchange(protocol.hello("bench"))
        frame = protocol.request(1, "status", {})
        mine = latencies[index]
        while time.time() < start_at:
            time.sleep(0.001)
        end = start_at + seconds
        while True:
            t0 = time.perf_counter()
            exchange(frame)
            mine.append(time.perf_counter() - t0)
            if time.time() >= end:
                break
        sock.close()

    threads = [threading.Thread(target=one, args=(i,)) for i in range(clients)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return [lat for per in latencies for lat in per]


def bench_scale(self: Bench, clusters: int = 1000, seconds: float = 5.0,
                readers: int = int(os.environ.get("CLUSTERD_BENCH_READERS", "2"))) -> None:
    """1,000 records answered by the in-memory load-test provider (test-only)."""
    print(f"(h) {clusters} clusters: refresh cycle, status latency while refreshing, RSS",
          file=sys.stderr)
    import psutil

    from clusterctl import Client, StatusArgs

    self.loadtest_clusters(clusters)
    cycle = self.refresh_cycle()
    self.record("scale_refresh_cycle_1000", cycle, "s", target="≤ 5 s", ok=cycle <= 5,
                clusters=clusters)
    stop = threading.Event()

    def refresher() -> None:
        with Client(self.socket, autostart=False) as client:
            while not stop.is_set():
                client.call(StatusArgs(refresh=True))

    # Readers in processes of their own: in one process their GIL would be what we measure.
    before = self.loop_stats()
    thread = threading.Thread(target=refresher)
    thread.start()
    with ProcessPoolExecutor(readers) as pool:
        futures = [pool.submit(_status_reader, str(self.socket), seconds, clusters)
                   for _ in range(readers)]
        results = [f.result() for f in futures]
    stop.set()
    thread.join()
    loop = self.loop_stats()
    for index, row in enumerate(("scale_status_p99_refreshing",
                                 "scale_status_columns_p99_refreshing")):
        latencies = [lat for result in results for lat in result[index]]
        p99 = percentile(latencies, 99) * 1000
        self.record(row, p99, "ms", target="≤ 20 ms", ok=p99 <= 20,
                    p50_ms=round(percentile(latencies, 50) * 1000, 2),
                    requests=len(latencies), readers=readers,
                    loop_lag_p99_ms=loop.get("lag_ms_p99"),
                    loop_held=self.held(loop, before), gc=self.gc_pauses(loop, before))
    assert self.daemon is not None
    rss = psutil.Process(self.daemon.pid).memory_info().rss / 2**20
    self.record("scale_daemon_rss", rss, "MiB", target="≤ 250 MB", ok=rss <= 250 * 1e6 / 2**20)


def _status_reader(socket_path: str, seconds: float,
                   expected: int) -> tuple[list[float], list[float]]:
    """Status back to back, as maps and in columns in turn (what clusterctl asks for)."""
    from clusterctl import Client, StatusArgs

    as_maps: list[float] = []
    in_columns: list[float] = []
    with Client(socket_path, autostart=False) as client:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            for columns, latencies in ((False, as_maps), (True, in_columns)):
                started = time.perf_counter()
                reply = client.call(StatusArgs(columns=columns))
                latencies.append(time.perf_counter() - started)
                shown = reply["clusters"]["rows"] if columns else reply["clusters"]
                if len(shown) < expected:
                    raise SystemExit("status lost clusters")
    return as_maps, in_columns


def bench_autostop_lag(self: Bench, clusters: int = 10, minutes: float = 0.05) -> None:
    print(f"(i) autostop lag over {clusters} local clusters", file=sys.stderr)
    names = [f"lag-{i}" for i in range(clusters)]
    for name in names:
        result = self.ctl("launch", "-c", name, "--", "true")
        if result.returncode != 0:
            raise SystemExit(f"launch {name} failed: {result.stderr}")
    deadlines: dict[str, float] = {}
    for name in names:
        self.ctl("autostop", name, "-i", str(minutes))
    status = json.loads(self.ctl("status", "--json").stdout)
    for cluster in status:
        if cluster["name"] in names:
            deadlines[cluster["name"]] = float(cluster["autostop_deadline"])
    lags = []
    deadline_all = time.time() + 120
    for name in names:
        while time.time() < deadline_all:
            events = json.loads(self.ctl("events", name, "--json").stdout)
            due = [e for e in events if e["kind"] == "autostop" and "due" in e["reason"]]
            if due:
                lags.append(due[-1]["ts"] - deadlines[name])
                break
            time.sleep(0.5)
    if len(lags) < len(names):
        raise SystemExit(f"only {len(lags)} of {len(names)} clusters autostopped")
    self.record("autostop_lag_p50", statistics.median(lags), "s",
                target="≤ 30 s (SkyPilot: checks every 60 s)", ok=max(lags) <= 30,
                max_s=round(max(lags), 2))
    for name in names:
        self.ctl("down", "-y", name)


BENCHES: dict[str, Callable[[Bench], None]] = {
    "status": Bench.bench_status,
    "exec": Bench.bench_exec,
    "socket": Bench.bench_socket,
    "queue": bench_queue,
    "installed": bench_installed,
    "queue_drain": bench_queue_drain,
    "ssh_exec": bench_ssh_exec,
    "ssh_throughput": bench_ssh_throughput,
    "ssh_concurrency": bench_ssh_concurrency,
    "autostop_lag": bench_autostop_lag,
    "scale": bench_scale,
    "aws_launch": bench_aws_launch,
    "aws_refresh": bench_aws_refresh,
    "failover": bench_failover,
    "aws_security_groups": bench_aws_security_groups,
    "k8s_launch": bench_k8s_launch,
    "k8s_refresh": bench_k8s_refresh,
    "k8s_bed": bench_k8s_bed,
    "dashboard_page": bench_dashboard_page,
    "dashboard_logs": bench_dashboard_logs,
    "managed": bench_managed,
    "storage": bench_storage,
    "curves_clusters": bench_curves_clusters,
    "curves_queue": bench_curves_queue,
    "curves_logs": bench_curves_logs,
    "curves_failover": bench_curves_failover,
    "kept_logs": bench_kept_logs,
    "cost_ledger": bench_cost_ledger,
}


def main() -> None:
    parser = argparse.ArgumentParser(prog="scripts/bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--json", action="store_true", help="print results as JSON")
    parser.add_argument("--only", help=f"comma-separated subset of {','.join(BENCHES)}")
    parser.add_argument("--write-docs", action="store_true",
                        help="write the results into docs/benchmarks.md (and .json), keeping "
                        "the rows this run did not measure")
    parser.add_argument("--out", type=Path, help="where charts go (default: a new directory "
                        "under /tmp, printed at the end)")
    args = parser.parse_args()
    chosen = args.only.split(",") if args.only else list(BENCHES)
    unknown = set(chosen) - set(BENCHES)
    if unknown:
        parser.error(f"unknown benchmark(s): {', '.join(sorted(unknown))}")
    bench = Bench()
    bench.out = args.out or Path(tempfile.mkdtemp(prefix="clusterd-bench-", dir="/tmp"))
    bench.out.mkdir(parents=True, exist_ok=True)
    try:
        bench.start()
        for name in chosen:
            BENCHES[name](bench)
    finally:
        bench.stop()
    meta = {"cpus": os.cpu_count(), "python": sys.version.split()[0],
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())}
    if args.write_docs:
        from bench_docs import write

        page = write(bench.rows, sorted(bench.out.glob("*.png")), notes=bench.notes)
        print(f"wrote {page}", file=sys.stderr)
    if bench.out.is_dir() and any(bench.out.iterdir()):
        print(f"charts and data: {bench.out}", file=sys.stderr)
    elif not args.out:
        bench.out.rmdir()
    if args.json:
        print(json.dumps({"meta": meta, "results": bench.rows}, indent=2))
        return
    print(f"\n{'benchmark':<26} {'value':>12} {'baseline':>12} {'ratio':>7}  "
          f"{'target':<24} details")
    shown = ("p90", "baseline_p90", "p50_ms", "p99_ms", "jobs_listed", "succeeded", "max_s",
             "requests", "phases", "local_phases", "all_calls", "refresh_s", "attempts",
             "max_ms", "total_p50_ms", "page_kib", "received", "printed",
             "lag_s", "cli_lines_per_s", "lines_shown", "closed_p50_s", "goal_s",
             "relaunch_p50_s", "paired_ratio_without_lag_p50", "without_provision_ratio",
             "per_job_kib", "jobs_per_s",
             "per_waiting_job_kib", "per_running_job_kib", "mb_per_s", "baseline_mb_per_s",
             "clusters", "jobs", "candidates", "growth", "submitted_per_s", "launch_s",
             "log_bytes", "written_mb_per_s", "walls", "baseline_walls", "cpu_s",
             "baseline_cpu_s", "loop_lag_p99_ms", "loop_held", "gc", "p95_ms",
             "baseline_p95_ms", "intervals", "in_window", "listed", "report_kib", "first_report_ms",
             "after_reports_mib", "small_loaded_mib")
    for row in bench.rows:
        base = f"{row['baseline']:.1f}" if row["baseline"] is not None else "-"
        ratio = f"{row['ratio']:.2f}" if row["ratio"] is not None else "-"
        verdict = "" if row["ok"] is None else (" ok" if row["ok"] else " MISSED")
        details = " ".join(f"{key}={row[key]}" for key in shown if key in row)
        print(f"{row['name']:<26} {row['value']:>9.1f} {row['unit']:<5} {base:>9} "
              f"{ratio:>7}  {row['target'] + verdict:<24} {details}")


if __name__ == "__main__":
    main()
