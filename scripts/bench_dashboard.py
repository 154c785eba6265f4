"""Dashboard benchmarks: the clusters page's time to first byte with 1,000 clusters beside a
plain `status` call, and how many log lines per second a job page keeps up with beside
`clusterctl logs`, each pair measured in the same run.

Run through `scripts/bench --only dashboard_page,dashboard_logs`. The dashboard is a real
`clusterctl dashboard` process of the bench's daemon; the page is read the way a browser
reads it (the token traded for a cookie, then plain HTTP and server-sent events).
"""

from __future__ import annotations

import contextlib
import http.client
import json
import re
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

VENV_BIN = Path(__file__).resolve().parents[1] / ".venv" / "bin"
URL = re.compile(r"http://127\.0\.0\.1:(\d+)/\?token=([A-Za-z0-9_-]+)")
LOG_LINES = 2_000_000  # about 110 MB: four seconds or so of printing flat out


class Page:
    """HTTP to the dashboard as its browser would send it."""

    def __init__(self, port: int, token: str) -> None:
        self.port = port
        status, headers, _ = self.get(f"/?token={token}", cookie="")
        if status != 302:
            raise SystemExit(f"the dashboard did not take its token: {status}")
        self.cookie = headers["set-cookie"].split(";", 1)[0]

    def connection(self) -> http.client.HTTPConnection:
        return http.client.HTTPConnection("127.0.0.1", self.port, timeout=120)

    def get(self, path: str, cookie: str | None = None
            ) -> tuple[int, dict[str, str], bytes]:
        connection = self.connection()
        try:
            connection.request("GET", path, headers={"Cookie": self.cookie
                                                      if cookie is None else cookie})
            response = connection.getresponse()
            return response.status, {k.lower(): v for k, v in response.getheaders()}, \
                response.read()
        finally:
            connection.close()

    def timed_get(self, path: str) -> tuple[float, float, int]:
        """Seconds to the first byte of the answer, to its last byte, and its size."""
        connection = self.connection()
        try:
            connection.connect()
            started = time.perf_counter()
            connection.request("GET", path, headers={"Cookie": self.cookie})
            response = connection.getresponse()  # the status line and headers are in
            first = time.perf_counter() - started
            body = response.read()
            total = time.perf_counter() - started
            if response.status != 200:
                raise SystemExit(f"GET {path}: {response.status}")
            return first, total, len(body)
        finally:
            connection.close()


@contextlib.contextmanager
def dashboard(bench: Any) -> Iterator[Page]:
    process = subprocess.Popen([str(VENV_BIN / "clusterctl"), "dashboard", "--no-browser"],
                               env=bench.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                               text=True, start_new_session=True)
    try:
        assert process.stdout is not None
        for line in process.stdout:
            match = URL.search(line)
            if match:
                yield Page(int(match.group(1)), match.group(2))
                break
        else:
            raise SystemExit(f"the dashboard did not start: {process.stderr.read()}")
    finally:
        process.send_signal(signal.SIGINT)
        try:
            process.wait(20)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


def bench_dashboard_page(bench: Any, clusters: int = 1000, runs: int = 30) -> None:
    print(f"(m) dashboard: clusters page with {clusters} clusters vs a status call",
          file=sys.stderr)
    from clusterctl import Client, StatusArgs

    bench.loadtest_clusters(clusters)
    first_bytes, totals, status_calls, size = [], [], [], 0
    with dashboard(bench) as page, Client(bench.socket, autostart=False) as client:
        for _ in range(3):  # warm both paths
            page.timed_get("/")
            client.call(StatusArgs())
        for _ in range(runs):  # interleaved, so both see the same machine
            started = time.perf_counter()
            shown = len(client.call(StatusArgs())["clusters"])
            status_calls.append(time.perf_counter() - started)
            first, total, size = page.timed_get("/")
            first_bytes.append(first)
            totals.append(total)
        _, _, body = page.get("/")
        rows = body.count(b"<tr data-cluster=")
    if rows < clusters or shown < clusters:
        raise SystemExit(f"the page shows {rows} clusters, status {shown}; {clusters} exist")
    ms = 1000
    p50 = statistics.median(first_bytes) * ms
    bench.record("dashboard_page_ttfb_p50", p50, "ms",
                 baseline=statistics.median(status_calls) * ms,
                 baseline_name=f"status call ({clusters} clusters, same socket)",
                 target="≤ 250 ms", ok=p50 <= 250,
                 p90=round(sorted(first_bytes)[int(0.9 * (runs - 1))] * ms, 1),
                 total_p50_ms=round(statistics.median(totals) * ms, 1),
                 page_kib=round(size / 1024), clusters=rows)


def bench_dashboard_logs(bench: Any, lines: int = LOG_LINES) -> None:
    print(f"(n) dashboard: a job page following a job that prints {lines} lines as fast as "
          "it can", file=sys.stderr)
    cluster = "bench"
    command = f'seq -f "line %g of a job that prints as fast as it can" 1 {lines}'
    with dashboard(bench) as page:
        result = bench.ctl("exec", cluster, "-d", "--", command)
        if result.returncode != 0:
            raise SystemExit(f"exec failed: {result.stderr}")
        jobs = json.loads(bench.ctl("queue", cluster, "--json").stdout)
        job_id = max(j["job_id"] for j in jobs)
        received, seconds, last_at = _follow_job_page(page, cluster, job_id)
    job = next(j for j in json.loads(bench.ctl("queue", cluster, "--json").stdout)
               if j["job_id"] == job_id)
    printing = max(1e-6, (job["ended_at"] or 0) - (job["started_at"] or 0))
    started = time.perf_counter()
    logs = subprocess.run([str(VENV_BIN / "clusterctl"), "logs", cluster, str(job_id),
                           "--no-follow"], env=bench.env, capture_output=True)
    cli_rate = logs.stdout.count(b"\n") / (time.perf_counter() - started)
    lag = last_at - (job["ended_at"] or last_at)
    bench.record("dashboard_log_lines_per_s", received / seconds, "lines/s",
                 baseline=lines / printing, baseline_name="the job printing them",
                 target="every line, ≤ 2 s behind", ok=received == lines and lag <= 2,
                 received=received, printed=lines, lag_s=round(lag, 2),
                 cli_lines_per_s=round(cli_rate))

    # Opening the page of that (large, finished) job: its last lines, not all of it.
    with dashboard(bench) as page:
        opened, tail_lines = [], 0
        for _ in range(5):
            started = time.perf_counter()
            tail_lines = _open_job_page(page, cluster, job_id)
            opened.append(time.perf_counter() - started)
    tailed = []
    for _ in range(5):
        started = time.perf_counter()
        subprocess.run([str(VENV_BIN / "clusterctl"), "logs", cluster, str(job_id), "--tail",
                        "1000", "--no-follow"], env=bench.env, capture_output=True)
        tailed.append(time.perf_counter() - started)
    ms = 1000
    p50 = statistics.median(opened) * ms
    bench.record("dashboard_log_open_ms", p50, "ms", baseline=statistics.median(tailed) * ms,
                 baseline_name="clusterctl logs --tail 1000 --no-follow",
                 target=f"≤ 500 ms for {lines} lines", ok=p50 <= 500 and tail_lines == 1000,
                 lines_shown=tail_lines)


def _open_job_page(page: Page, cluster: str, job_id: int) -> int:
    """A browser opening a finished job's page: the page, then its live stream up to `done`
    (the log's last lines); how many lines it showed."""
    status, _, _ = page.get(f"/clusters/{cluster}/jobs/{job_id}")
    if status != 200:
        raise SystemExit(f"job page: {status}")
    connection = page.connection()
    try:
        connection.request("GET", f"/live/clusters/{cluster}/jobs/{job_id}",
                           headers={"Cookie": page.cookie})
        response = connection.getresponse()
        shown, event = 0, ""
        while line := response.readline():
            if line.startswith(b"event: "):
                event = line[7:].strip().decode()
            elif line.startswith(b"data: ") and event == "log":
                shown += json.loads(line[6:])["html"].count("\n")
            elif line.startswith(b"data: ") and event == "done":
                return shown
        raise SystemExit("the live stream ended without `done`")
    finally:
        connection.close()


def _follow_job_page(page: Page, cluster: str, job_id: int) -> tuple[int, float, float]:
    """The job page's live stream from the log's first byte (as a browser resuming at offset
    0 asks for it) until the job ends: lines received, seconds from the first to the last,
    and when the last came (Unix seconds)."""
    connection = page.connection()
    try:
        connection.request("GET", f"/live/clusters/{cluster}/jobs/{job_id}",
                           headers={"Cookie": page.cookie, "Last-Event-ID": "0"})
        response = connection.getresponse()
        if response.status != 200:
            raise SystemExit(f"live stream: {response.status}")
        received = 0
        first = last = None
        last_at = 0.0
        event = ""
        while True:
            line = response.readline()
            if not line:
                raise SystemExit("the live stream ended before the job did")
            if line.startswith(b"event: "):
                event = line[7:].strip().decode()
            elif line.startswith(b"data: ") and event == "log":
                html = json.loads(line[6:])["html"]
                if html:
                    received += html.count("\n")
                    last, last_at = time.perf_counter(), time.time()
                    first = first or last
            elif line.startswith(b"data: ") and event == "done":
                break
        if first is None or last is None:
            raise SystemExit("no log lines came")
        return received, max(last - first, 1e-6), last_at
    finally:
        connection.close()

