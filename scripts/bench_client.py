"""Client and queue benchmarks: `queue` of 200 jobs, clusterctl as a user's install runs it,
and how fast a queued batch of jobs drains (scripts/bench --only queue,installed,queue_drain)."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from benchmarks import Bench

DRAIN_JOBS = 200


def submit_jobs(client: Any, count: int) -> list[int]:
    """`count` detached one-line jobs on the bench cluster, 50 to a call; their ids."""
    from benchmarks import CLUSTER

    from clusterctl import ExecArgs

    ids: list[int] = []
    for start in range(0, count, 50):
        batch = [ExecArgs(cluster=CLUSTER, command="true", detach=True)
                 for _ in range(min(50, count - start))]
        for result in client.call_many(batch):
            if isinstance(result, Exception):
                raise SystemExit(f"submitting jobs failed: {result}")
            ids.append(int(result["job_id"]))
    return ids


def ensure_jobs(bench: Bench, jobs: int) -> int:
    """At least `jobs` finished jobs in the bench cluster's queue (one-line jobs added, and
    waited for: a listing timed while they run measures them too); how many it lists."""
    from benchmarks import CLUSTER

    from clusterctl import Client, QueueArgs

    existing = json.loads(bench.ctl("queue", CLUSTER, "--json").stdout)
    with Client(bench.socket, autostart=False) as client:
        submit_jobs(client, max(0, jobs - len(existing)))
        deadline = time.monotonic() + 600
        while client.call(QueueArgs(cluster=CLUSTER, skip_finished=True))["jobs"]:
            if time.monotonic() > deadline:
                raise SystemExit("the bench's jobs did not finish within 10 minutes")
            time.sleep(0.2)
    return len(json.loads(bench.ctl("queue", CLUSTER, "--json").stdout))


def bench_queue(self: Bench, jobs: int = 200, runs: int = 20) -> None:
    from benchmarks import CLUSTER, CLUSTERCTL, _wall, percentile

    print(f"(d) clusterctl queue with {jobs} jobs", file=sys.stderr)
    count = ensure_jobs(self, jobs)
    ours, base = [], []
    for _ in range(runs):
        base.append(_wall([sys.executable, "-c", "pass"], self.env))
        ours.append(_wall([CLUSTERCTL, "queue", CLUSTER], self.env))
    p50 = statistics.median(ours) * 1000
    self.record("queue_200_jobs_p50", p50, "ms", baseline=statistics.median(base) * 1000,
                baseline_name="python -c pass", target="≤ 30 ms", ok=p50 <= 30,
                jobs_listed=count, p90=round(percentile(ours, 90) * 1000, 1))


def installed_layout(bench: Bench) -> tuple[str, str]:
    """A venv as `pip install .` leaves one: this checkout and its dependencies on sys.path
    by a plain .pth file. The dev venv the other rows use is an editable install, whose
    import hook runs at every interpreter start (~9 ms, in `python -c pass` too): what a
    user's clusterctl pays is measured here. Returns its python and its clusterctl."""
    import msgpack

    import clusterctl
    import clusterd

    venv = bench.root / "installed"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    site = next((venv / "lib").glob("python3.*/site-packages"))
    paths = [Path(clusterctl.__file__).parents[1], Path(clusterd.__file__).parents[1],
             Path(msgpack.__file__).parents[1]]
    (site / "clusterd-installed.pth").write_text("".join(f"{p}\n" for p in paths))
    python = venv / "bin" / "python"
    script = venv / "bin" / "clusterctl"
    script.write_text(f"#!{python}\n" + textwrap.dedent("""\
        import sys
        from clusterctl.cli import main
        if __name__ == '__main__':
            sys.exit(main())
        """))
    script.chmod(0o755)
    return str(python), str(script)


def bench_installed(self: Bench, runs: int = 30) -> None:
    """status, exec's first line and queue, each beside `python -c pass` of the same venv."""
    from benchmarks import CLUSTER, _first_line, _wall, percentile

    print("(installed) clusterctl as installed by pip, beside its python -c pass",
          file=sys.stderr)
    python, ctl = installed_layout(self)
    listed = ensure_jobs(self, 200)  # the queue row's goal is for 200 jobs
    cases = {"status": [ctl, "status"], "queue": [ctl, "queue", CLUSTER],
             "exec": [ctl, "exec", CLUSTER, "--", "echo hi"]}
    times: dict[str, list[float]] = {name: [] for name in [*cases, "python"]}
    for _ in range(3):
        _first_line(cases["exec"], self.env)
    for _ in range(runs):  # interleaved, so each sees the same machine
        times["python"].append(_wall([python, "-c", "pass"], self.env))
        times["status"].append(_wall(cases["status"], self.env))
        times["queue"].append(_wall(cases["queue"], self.env))
        times["exec"].append(_first_line(cases["exec"], self.env)[0])
    base = statistics.median(times["python"]) * 1000
    targets = {"status": ("≤ 2x python -c pass", 2 * base), "queue": ("≤ 30 ms", 30.0),
               "exec": ("≤ 40 ms", 40.0)}
    names = {"status": "status_wall_p50_installed", "queue": "queue_p50_installed",
             "exec": "exec_first_line_p50_installed"}
    for case, (target, limit) in targets.items():
        p50 = statistics.median(times[case]) * 1000
        extra = {"jobs_listed": listed} if case == "queue" else {}
        self.record(names[case], p50, "ms", baseline=base,
                    baseline_name="python -c pass, same venv", target=target, ok=p50 <= limit,
                    p90=round(percentile(times[case], 90) * 1000, 1), **extra)


def bench_queue_drain(self: Bench) -> None:
    """DRAIN_JOBS detached one-line jobs submitted at once: seconds from the first submitted
    to the last finished, as the agent records them (jobs of one shape, four at a time on
    a two-CPU machine: what limits them is how fast a job follows the one before)."""
    from benchmarks import CLUSTER

    from clusterctl import Client, QueueArgs

    print(f"(queue_drain) {DRAIN_JOBS} queued jobs, submission to the last one's end",
          file=sys.stderr)
    with Client(self.socket, autostart=False) as client:
        wanted = set(submit_jobs(client, DRAIN_JOBS))
        deadline = time.monotonic() + 600
        while True:
            jobs = [j for j in client.call(QueueArgs(cluster=CLUSTER))["jobs"]
                    if j["job_id"] in wanted]
            if all(j["ended_at"] for j in jobs) and len(jobs) == len(wanted):
                break
            if time.monotonic() > deadline:
                raise SystemExit("the queued jobs did not finish within 10 minutes")
            time.sleep(0.2)
    drain = max(j["ended_at"] for j in jobs) - min(j["submitted_at"] for j in jobs)
    failed = [j["job_id"] for j in jobs if j["status"] != "SUCCEEDED"]
    if failed:
        raise SystemExit(f"queued jobs failed: {failed[:10]}")
    self.record("queue_drain_200_jobs", drain, "s", jobs=len(jobs),
                jobs_per_s=round(len(jobs) / drain, 1))
