"""The ssh node-pool benchmarks (`scripts/bench --only ssh_exec,ssh_throughput,
ssh_concurrency`): exec latency and log throughput on a 2-node cluster of the ssh test bed,
and many execs and log tails at once. They need root (the test bed makes users and sshd
hosts)."""

from __future__ import annotations

import statistics
import subprocess
import sys
import threading
import time
from typing import Any


def bench_ssh_exec(self: Any, runs: int = 20) -> None:
    from benchmarks import CLUSTERCTL, SSH_CLUSTER, _first_line, percentile

    print("(e) exec on a two-node ssh cluster", file=sys.stderr)
    self.ssh_cluster()
    argv = [CLUSTERCTL, "exec", SSH_CLUSTER, "--num-nodes", "2", "--", "echo hi"]
    for _ in range(3):
        _first_line(argv, self.env, expect=b"(head, rank=0) hi")
    firsts, exits = [], []
    for _ in range(runs):
        first, total = _first_line(argv, self.env, expect=None)
        firsts.append(first)
        exits.append(total)
    p50 = statistics.median(firsts) * 1000
    self.record("ssh_exec_first_line_p50", p50, "ms", target="≤ 200 ms", ok=p50 <= 200,
                p90=round(percentile(firsts, 90) * 1000, 1))
    self.record("ssh_exec_exit_p50", statistics.median(exits) * 1000, "ms",
                p90=round(percentile(exits, 90) * 1000, 1))


def bench_ssh_throughput(self: Any, mib: int = 50, runs: int = 5) -> None:
    from benchmarks import CLUSTERCTL, SSH_CLUSTER

    print(f"(f) a job printing {mib} MiB, through the tunnel vs ssh cat", file=sys.stderr)
    hosts = self.ssh_cluster()
    head = hosts[0]
    size = mib * 1024 * 1024
    make = f"head -c {size} /dev/zero | tr '\\0' a | fold -w 99"
    assert self.bed is not None
    def ssh(host: dict[str, Any]) -> list[str]:
        assert self.bed is not None
        return ["ssh", "-i", str(self.bed / "id_ed25519"), "-p", str(host["port"]), "-o",
                "BatchMode=yes", "-o", "StrictHostKeyChecking=no", "-o",
                "UserKnownHostsFile=/dev/null", "-o", "LogLevel=ERROR",
                f"{host['user']}@{host['ip']}"]

    data = "/tmp/cdb-bench.txt"
    subprocess.run([*ssh(head), f"{make} > {data}; chmod a+r {data}"], check=True)
    ours, base, received = [], [], 0
    for _ in range(runs):
        started = time.perf_counter()
        subprocess.run([*ssh(head), f"cat {data}"], stdout=subprocess.DEVNULL, check=True)
        base.append(time.perf_counter() - started)
        # The same bytes by the same means (cat), run as a job on a node and streamed back.
        started = time.perf_counter()
        done = subprocess.run([CLUSTERCTL, "exec", SSH_CLUSTER, "--", f"cat {data}"],
                              env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        ours.append(time.perf_counter() - started)
        received = len(done.stdout)
        if done.returncode != 0 or received < size:
            raise SystemExit(f"throughput job failed: exit {done.returncode}, {received} bytes")
    rate = received / statistics.median(ours) / 2**20
    base_rate = received / statistics.median(base) / 2**20
    self.record("ssh_log_throughput", rate, "MiB/s", baseline=base_rate,
                baseline_name="ssh host cat (same bytes)", target="≥ 0.5x ssh cat",
                ok=rate >= 0.5 * base_rate, bytes=received)
    subprocess.run([*ssh(head), f"rm -f {data}"])


def bench_ssh_concurrency(self: Any) -> None:
    from benchmarks import CLUSTERCTL, SSH_CLUSTER

    print("(g) 50 concurrent execs; 100 concurrent logs --tail 100 --no-follow", file=sys.stderr)
    self.ssh_cluster()
    started = time.perf_counter()
    execs = [subprocess.Popen([CLUSTERCTL, "exec", SSH_CLUSTER, "--", f"echo n{i}"],
                              env=self.env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
             for i in range(50)]
    ok = sum(1 for i, p in enumerate(execs) if p.communicate()[0] == f"n{i}\n".encode()
             and p.returncode == 0)
    total = time.perf_counter() - started
    self.record("ssh_50_concurrent_execs", total, "s", target="all 50 succeed", ok=ok == 50,
                succeeded=ok)
    job = self.ctl("exec", SSH_CLUSTER, "--", "seq 1 1000")
    job_id = next(line.split()[1] for line in job.stderr.splitlines() if "submitted" in line)
    started = time.perf_counter()
    tails = [subprocess.Popen([CLUSTERCTL, "logs", SSH_CLUSTER, job_id, "--tail", "100",
                               "--no-follow"], env=self.env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL) for _ in range(100)]
    good = sum(1 for p in tails if p.communicate()[0].count(b"\n") == 100 and p.returncode == 0)
    total = time.perf_counter() - started
    self.record("ssh_100_concurrent_tails", total, "s", target="≤ 2 s (SkyPilot: 16 s)",
                ok=total <= 2 and good == 100, succeeded=good,
                note="100 clusterctl processes on this machine's cores")
    from clusterctl import Client, LogsArgs

    def one() -> int:
        with Client(self.socket, autostart=False) as client:
            stream = client.stream(LogsArgs(cluster=SSH_CLUSTER, job_id=int(job_id),
                                            follow=False, tail=100))
            return sum(data["data"].count(b"\n") for name, data in stream if name == "log")

    started = time.perf_counter()
    results: list[int] = []
    threads = [threading.Thread(target=lambda: results.append(one())) for _ in range(100)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    total = time.perf_counter() - started
    self.record("ssh_100_concurrent_tails_in_process", total, "s",
                target="daemon side of the above", ok=results.count(100) == 100,
                succeeded=results.count(100))
