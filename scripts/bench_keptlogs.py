"""What keeping a copy of jobs' logs on this machine costs (keptlogs/), side by side in one run:

- a job printing 1 GB (10 million lines of 100 bytes) on the local cluster, its wall time as
  the job itself measures it, with the daemon keeping its copy (the default caps: 100 MB per
  job, so the copy is cut again and again, as for any log this size) against the same daemon
  restarted with copies off (CLUSTERD_KEPT_LOG_JOB_BYTES=0), interleaved: with, without, with,
  without (medians, over PAIRS pairs);
- the daemon's CPU seconds (utime + stime from /proc) from the job's submission until its copy
  is complete, per MB copied, against the same span with copies off.

Jobs are submitted detached (`exec -d`): no client streams the log, so what the job competes
with is the daemon's copying alone. Run through `scripts/bench --only kept_logs`.
"""

from __future__ import annotations

import json
import os
import re
import statistics
import sys
import time
from pathlib import Path
from typing import Any

LINES = 10_000_000  # of 100 bytes: 1 GB
# Interleaved pairs (the machine is shared: a median over three outlasts a passing load).
PAIRS = int(os.environ.get("CLUSTERD_BENCH_KEPT_PAIRS", "3"))
TOOK = re.compile(r"took ([\d.]+)")
JOB = ("python3 -c \"import sys, time\n"
       "started = time.monotonic(); w = sys.stdout.write; line = 'x' * 99 + '\\n'\n"
       f"for _ in range({LINES}): w(line)\n"
       "sys.stdout.flush(); print('took %.3f' % (time.monotonic() - started))\"")


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _wait(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.2)


def _complete(bench: Any, cluster: str, job_id: int) -> bool:
    for jobs_file in (bench.root / "state" / "clusterd" / "kept-logs").glob(
            f"{cluster}@*/jobs.json"):
        job = json.loads(jobs_file.read_text()).get(str(job_id))
        if job and job["complete"]:
            return True
    return False


def _one(bench: Any, cluster: str, keeping: bool) -> tuple[float, float]:
    """(the job's own wall time, the daemon's CPU seconds until done and, if keeping, copied)."""
    assert bench.daemon is not None
    before = _cpu_seconds(bench.daemon.pid)
    submitted = bench.ctl("exec", cluster, "-d", "--", JOB)
    if submitted.returncode != 0:
        raise SystemExit(f"exec failed: {submitted.stderr[-500:]}")
    job_id = max(j["job_id"] for j in json.loads(bench.ctl("queue", cluster, "--json").stdout))

    def finished() -> bool:
        jobs = json.loads(bench.ctl("queue", cluster, "--json").stdout)
        return any(j["job_id"] == job_id and j["status"] == "SUCCEEDED" for j in jobs)

    _wait(finished, 900, "the 1 GB job")
    if keeping:
        _wait(lambda: _complete(bench, cluster, job_id), 900, "the copy to complete")
    cpu = _cpu_seconds(bench.daemon.pid) - before
    last = bench.ctl("logs", cluster, str(job_id), "--no-follow", "--tail", "1").stdout
    found = TOOK.search(last)
    if not found:
        raise SystemExit(f"the job did not say how long it took: {last[-200:]!r}")
    return float(found.group(1)), cpu


def bench_kept_logs(bench: Any) -> None:
    print("(k) a job printing 1 GB, with and without the daemon keeping its log's copy",
          file=sys.stderr)
    from benchmarks import CLUSTER

    runs: dict[bool, list[tuple[float, float]]] = {True: [], False: []}
    try:
        for _ in range(PAIRS):
            for keeping in (True, False):
                bench._restart_daemon(
                    {} if keeping else {"CLUSTERD_KEPT_LOG_JOB_BYTES": "0"}, lambda: None)
                runs[keeping].append(_one(bench, CLUSTER, keeping))
    finally:
        bench._restart_daemon({}, lambda: None)
    with_s = statistics.median(wall for wall, _ in runs[True])
    without_s = statistics.median(wall for wall, _ in runs[False])
    cpu_with = statistics.median(cpu for _, cpu in runs[True])
    cpu_without = statistics.median(cpu for _, cpu in runs[False])
    megabytes = LINES * 100 / 1e6
    bench.record("kept_log_job_1gb", with_s, "s", baseline=without_s,
                 baseline_name="copies off", target="≤ 1.1x without the copy",
                 ok=with_s <= 1.1 * without_s,
                 walls=[round(w, 2) for w, _ in runs[True]],
                 baseline_walls=[round(w, 2) for w, _ in runs[False]])
    bench.record("kept_log_cpu_per_mb", (cpu_with - cpu_without) / megabytes * 1000, "ms",
                 target="(reported)", cpu_s=round(cpu_with, 2),
                 baseline_cpu_s=round(cpu_without, 2), log_bytes=LINES * 100)
