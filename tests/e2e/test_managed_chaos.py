"""Chaos for managed jobs on the EC2 test bed: spot jobs (succeeding, failing with `exit 3`
with and without `max_restarts_on_errors`, cancelled while STARTING, RUNNING or RECOVERING)
while a seeded schedule preempts their instances, adds and clears capacity faults, and kills
the daemon with SIGKILL (when some job is STARTING, RUNNING, RECOVERING or CANCELLING, and
at named points of a launch, a submission, a log stream or a teardown) and restarts it. The
refresh loop runs every 3 s, so it races the controller for lost clusters.

At the end every job is in the final status its plan calls for, with the attempts, recoveries
and restarts that the chaos did to it and a log with each attempt's output once and a marker
per recovery; no job ever had instances of two launches alive at once (the bed's instances
are sampled twice a second throughout); no instance or security group is left; and every
record is accounted for (`jobs queue --all` has every job, `status` none of their clusters,
every cluster record made was ended, no request is left running).

A job's plan fixes which attempts are preempted: those attempts sleep until the test preempts
them (after their first line is in the log), the others run a few seconds. So the expected
numbers do not depend on timing, and a preemption can never race the job's own end.

Seeded: CLUSTERD_CHAOS_SEED (printed on failure) fixes the plans and the sequence of chaos
decisions; the moments they land on depend on the machine's speed. CLUSTERD_CHAOS_MANAGED_JOBS
is the number of jobs (default 20: about 270 s and 450 CPU-seconds on a 2-core machine, four
jobs at a time; scripts/test runs it with 10, one of each plan kind, to keep the whole suite
in its budget; more for a long run), e.g.

    CLUSTERD_CHAOS_SEED=7 CLUSTERD_CHAOS_MANAGED_JOBS=40 \
        pytest -m chaos tests/e2e/test_managed_chaos.py
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import random
import re
import sqlite3
import sys
import threading
import time
from collections import Counter
from collections.abc import Iterator
from typing import Any

import pytest

from tests.e2e.ec2bed import EC2Bed, running
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ray, pytest.mark.chaos]

SEED = int(os.environ.get("CLUSTERD_CHAOS_SEED", "20261201"))
JOBS = int(os.environ.get("CLUSTERD_CHAOS_MANAGED_JOBS", "20"))
AT_ONCE = 4  # unfinished jobs at a time: every one is a Ray cluster on this machine's cores
FINAL = {"SUCCEEDED", "CANCELLED", "FAILED", "FAILED_SETUP", "FAILED_PRECHECKS",
         "FAILED_NO_RESOURCE", "FAILED_CONTROLLER"}
# Where an armed daemon kills itself (clusterd/faults.py): each is a moment of a job's life.
KILL_POINTS = ("launch.before_create", "launch.after_create", "launch.waiting",
               "launch.during_install", "launch.after_agent", "exec.during_submit",
               "exec.streaming", "down.mid_teardown", "down.mid_terminate")
ARMED_AT_MOST = 60.0  # an armed daemon whose point no job reached is restarted unarmed
KILL_TRIGGERS = ("STARTING", "RUNNING", "RUNNING", "RECOVERING", "CANCELLING")
KILL_GAP = (20.0, 60.0)  # seconds of the daemon's life between kills, at least; at most
ZONES = {"us-east-1": ("us-east-1a", "us-east-1b", "us-east-1c", "us-east-1d", "us-east-1f"),
         "us-west-2": ("us-west-2a", "us-west-2b", "us-west-2c")}
# Ten plans, repeated and shuffled: four succeed, three fail (exit 3), three are cancelled.
KINDS = ("succeed", "fail2", "cancel:RUNNING", "succeed", "fail0", "cancel:STARTING",
         "succeed", "fail2", "cancel:RECOVERING", "succeed")
REPLAY = (f"replay: CLUSTERD_CHAOS_SEED={SEED} CLUSTERD_CHAOS_MANAGED_JOBS={JOBS} "
          "pytest -m chaos tests/e2e/test_managed_chaos.py")


@dataclasses.dataclass
class Plan:
    index: int
    kind: str  # succeed | fail0 | fail2 | cancel:STATUS (the status to cancel it in)
    preemptions: int  # attempts 1..preemptions sleep until the test preempts them
    job_id: int | None = None
    cluster: str = ""
    preempted: list[int] = dataclasses.field(default_factory=list)  # attempts preempted
    preempt_due: float | None = None  # when the current attempt is to be preempted
    cancel_due: float | None = None
    cancelled_in: str | None = None  # the status it showed when cancel was sent

    @property
    def name(self) -> str:
        return f"mchaos{self.index}"

    @property
    def restarts(self) -> int:
        return 2 if self.kind == "fail2" else 0

    def task(self, images: dict[str, str]) -> str:
        recovery = ("  job_recovery:\n    max_restarts_on_errors: 2\n"
                    if self.kind == "fail2" else "")
        image = ("  image_id:\n" + "".join(f"    {region}: {ami}\n"
                                           for region, ami in images.items())) if images else ""
        # Cancelled jobs never end by themselves; the others sleep only in the attempts that
        # are to be preempted, then print a few lines and end.
        long = "true" if self.kind.startswith("cancel") else f'[ "$A" -le {self.preemptions} ]'
        end = {"succeed": 'echo "done $A"', "fail0": 'echo "failing $A"; exit 3',
               "fail2": 'echo "failing $A"; exit 3'}.get(self.kind, "")
        return (f"resources:\n  cpus: 2\n  use_spot: true\n{image}{recovery}"
                "run: |\n"
                "  A=$SKYPILOT_MANAGED_JOB_ATTEMPT\n"
                '  echo "start $A task=$SKYPILOT_TASK_ID"\n'
                f"  if {long}; then sleep 900; fi\n"
                '  for i in 1 2 3; do echo "tick $A.$i"; sleep 1; done\n'
                f"  {end}\n")


def make_plans(rng: random.Random, count: int) -> list[Plan]:
    kinds = [KINDS[i % len(KINDS)] for i in range(count)]
    rng.shuffle(kinds)
    plans = []
    for index, kind in enumerate(kinds):
        if kind == "succeed":
            preemptions = rng.choice((0, 1, 1, 2))
        elif kind in ("fail0", "fail2"):
            preemptions = rng.choice((0, 0, 1))
        elif kind == "cancel:RECOVERING":
            preemptions = 1  # cancelled once its first attempt is preempted
        elif kind == "cancel:RUNNING":
            preemptions = rng.choice((0, 1))
        else:
            preemptions = 0
        plans.append(Plan(index, kind, preemptions))
    return plans


class BedWatch(threading.Thread):
    """The bed's instances of one daemon, sampled twice a second (from the bed's controller,
    no process started): the latest picture (which instance to preempt), and every moment a
    cluster had live instances of two launches (two cloud names) at once."""

    def __init__(self, ec2: EC2Bed, managed_by: str) -> None:
        super().__init__(name="bed-watch", daemon=True)
        self._ec2 = ec2
        self._managed_by = managed_by
        self._halt = threading.Event()
        self.latest: list[dict[str, Any]] = []
        self.doubles: list[str] = []
        self.errors: list[str] = []
        self.samples = 0
        self.most_alive = 0

    def run(self) -> None:
        while not self._halt.wait(0.5):
            try:
                mine = [i for i in self._ec2.instances_now()
                        if i["tags"].get("clusterd-managed-by") == self._managed_by]
            except Exception as exc:  # counted; any fails the test at the end
                self.errors.append(f"{type(exc).__name__}: {exc}")
                continue
            alive = [i for i in mine if i["state"] != "terminated"]
            launches: dict[str, set[str]] = {}
            for i in alive:
                launches.setdefault(i["tags"].get("clusterd-cluster", "?"), set()).add(
                    i["tags"].get("clusterd-cluster-name", "?"))
            for cluster, names in launches.items():
                if len(names) > 1:
                    self.doubles.append(f"{time.strftime('%H:%M:%S')} {cluster}: "
                                        f"{sorted(names)}")
            self.latest = mine
            self.samples += 1
            self.most_alive = max(self.most_alive, len(alive))

    def alive_of(self, cluster: str) -> list[str]:
        return [i["id"] for i in self.latest
                if i["tags"].get("clusterd-cluster") == cluster and i["state"] == "running"]

    def close(self) -> None:
        self._halt.set()
        self.join(10)


class Chaos:
    """The daemon under chaos, and every call to it tolerant of its being down.

    Kills come from a budget, each at a moment some job is in a chosen status (STARTING,
    RUNNING, RECOVERING, CANCELLING), and at least KILL_GAP seconds of the daemon's life
    apart: kills on a clock alone would, on a slow machine, interrupt every launch before it
    ends. Most restarts (3 in 5) are armed to kill the daemon again at a named point (a launch, a
    submission, a log stream or a teardown); one no job reaches in ARMED_AT_MOST seconds is
    restarted unarmed."""

    def __init__(self, ec2: EC2Bed, daemon: Daemon, rng: random.Random, started: float
                 ) -> None:
        self.ec2 = ec2
        self.daemon = daemon
        self.rng = rng  # kills and restarts
        self.delays = random.Random(f"{SEED}-delays")  # of each preemption and cancel
        self.started = started
        self.kills_left = max(3, round(JOBS * 0.4))
        self.trigger = rng.choice(KILL_TRIGGERS)
        self.kill_from = self.now() + rng.uniform(*KILL_GAP)
        self.restart_at: float | None = None
        self.armed: str | None = None
        self.armed_since = 0.0
        self.armed_next: str | None = None  # the point the next restart arms
        self.figures: Counter[str] = Counter()
        self.log: list[str] = []

    def now(self) -> float:
        return time.monotonic() - self.started

    def note(self, text: str) -> None:
        line = f"{self.now():6.1f}s {text}"
        self.log.append(line)
        print(f"managed chaos: {line}", file=sys.stderr, flush=True)

    @property
    def up(self) -> bool:
        process = self.daemon.process
        return self.restart_at is None and process is not None and process.poll() is None

    def tick(self, statuses: set[str]) -> None:
        """Kill, notice a death, restart: whatever is due now. `statuses`: those of the
        unfinished jobs as last seen."""
        process = self.daemon.process
        assert process is not None
        now = self.now()
        if self.restart_at is None and process.poll() is not None:
            self.figures["died at its point" if self.armed else "died by itself"] += 1
            self.note(f"the daemon died (armed at {self.armed})")
            self.restart_at = now + self.rng.uniform(0, 4)
        elif self.restart_at is None and self.armed and \
                now - self.armed_since > ARMED_AT_MOST:
            self.kill(f"no job reached {self.armed} in {ARMED_AT_MOST:.0f} s: kill -9, "
                      "restarted unarmed", arm=False)
        elif self.restart_at is None and not self.armed and self.kills_left and \
                now >= self.kill_from and (self.trigger in statuses
                                           or now > self.kill_from + KILL_GAP[1]):
            self.kills_left -= 1
            self.kill(f"kill -9 (a job {self.trigger})" if self.trigger in statuses
                      else f"kill -9 (no job {self.trigger} for {KILL_GAP[1]:.0f} s)",
                      arm=True)
            self.trigger = self.rng.choice(KILL_TRIGGERS)
        if self.restart_at is not None and now >= self.restart_at:
            self.restart()

    def restart(self) -> None:
        old = self.daemon.process
        self.restart_at = None
        point, self.armed_next = self.armed_next, None
        self.armed, self.armed_since = point, self.now()
        self.kill_from = self.now() + self.rng.uniform(*KILL_GAP)
        try:
            self.daemon.start({"CLUSTERD_TEST_FAULTS": point} if point else None)
        except AssertionError:
            if self.daemon.process is None or self.daemon.process.poll() is None:
                raise
            # An armed daemon that reached its point at once: seen on the next tick.
        new = self.daemon.process
        self.note(f"daemon restarted (pid {old.pid if old else '?'} -> "
                  f"{new.pid if new else '?'})" + (f", armed at {point}" if point else ""))
        if point:
            self.figures["restarts armed"] += 1

    def kill(self, why: str, *, arm: bool) -> None:
        self.daemon.kill()
        self.figures["kill -9"] += 1
        self.armed_next = (self.rng.choice(KILL_POINTS)
                           if arm and self.rng.random() < 0.6 else None)
        self.restart_at = self.now() + self.rng.uniform(0, 4)
        self.note(f"{why} (restart in {self.restart_at - self.now():.1f} s)")

    def settle(self) -> None:
        """Up and unarmed, for the final checks."""
        self.tick(set())  # notices a death
        if self.up and self.armed:
            self.kill("the jobs ended: kill -9, restarted unarmed", arm=False)
        if not self.up:
            self.armed_next = None
            self.restart()
        assert self.up and not self.armed, self.daemon.log()[-3000:]

    def ctl(self, *args: str) -> Any:
        """The JSON or text reply, or None if the daemon is down (or died during the call)."""
        if not self.up:
            return None
        result = self.daemon.ctl(*args)
        if result.returncode != 0:
            process = self.daemon.process
            if process is not None and process.poll() is not None:
                return None
            if args[:2] == ("jobs", "logs") and result.returncode in (100, 101, 103):
                return result.stdout
            raise AssertionError(f"clusterctl {' '.join(args)}: {result.returncode}\n"
                                 f"{result.stderr}")
        return result.stdout


def apply_faults(ec2: EC2Bed, rng: random.Random, chaos: Chaos) -> None:
    """Replace the bed's fault rules: none, or capacity gone from one region (all of it, or
    some zones, or the next few spot launches). The other region always has room, so a first
    launch always lands somewhere and the plans' outcomes do not depend on timing."""
    ec2.clear_faults()
    choice = rng.choice(("clear", "region", "zones", "zones", "next launches"))
    region = rng.choice(sorted(ZONES))
    base = ["--code", "InsufficientInstanceCapacity", "--action", "RunInstances"]
    if choice == "region":
        ec2.fault(*base, "--region", region, "--market", "spot")
    elif choice == "zones":
        for zone in rng.sample(ZONES[region], rng.randint(1, len(ZONES[region]) - 1)):
            ec2.fault(*base, "--zone", zone)
    elif choice == "next launches":
        ec2.fault(*base, "--region", region, "--count", str(rng.randint(1, 3)))
    chaos.figures[f"faults: {choice}"] += 1
    chaos.note(f"capacity faults: {choice}" + ("" if choice == "clear" else f" ({region})"))


@pytest.fixture(scope="module")
def mchaos(ec2: EC2Bed) -> Iterator[Daemon]:
    # The refresh loop every 3 s (not 30): it finds lost clusters too, and races the
    # controller's own detection, teardown and relaunch of them far more often.
    with running(ec2.daemon("cdmc-", CLUSTERD_AGENT_AUTOSTOP_GRACE="5",
                            CLUSTERD_RETRY_GAP="2", CLUSTERD_RETRY_MAX_GAP="5",
                            CLUSTERD_REFRESH_INTERVAL="3")) as daemon:
        try:
            yield daemon
        finally:
            ec2.clear_faults()
            # A failed run leaves jobs: cancel takes their clusters (`down` refuses them).
            if daemon.process is not None and daemon.process.poll() is None:
                daemon.ctl("jobs", "cancel", "--all")
                with contextlib.suppress(AssertionError):
                    wait_for(lambda: json.loads(daemon.ctl("jobs", "queue", "--json").stdout)
                             == [], 300, "every managed job to end", interval=2)


def submit(chaos: Chaos, plan: Plan, images: dict[str, str], jobs: list[dict[str, Any]]
           ) -> None:
    """Submit the plan's job; if an earlier try's reply was lost to a kill, adopt that job."""
    known = next((j for j in jobs if j["name"] == plan.name), None)
    if known is None:
        (chaos.daemon.root / f"{plan.name}.yaml").write_text(plan.task(images))
        out = chaos.daemon.ctl("jobs", "launch", "-d", "-n", plan.name, "--infra", "aws",
                               f"{plan.name}.yaml") if chaos.up else None
        found = re.search(r"Managed job (\d+) submitted", out.stderr) if out else None
        if found is None:
            return  # the daemon is down, or died during the call: looked for again later
        plan.job_id = int(found.group(1))
    else:
        plan.job_id = known["job_id"]
    if plan.kind == "cancel:STARTING":
        plan.cancel_due = chaos.now() + chaos.delays.uniform(0, 6)
    chaos.note(f"{plan.name}: job {plan.job_id} submitted ({plan.kind}, "
               f"{plan.preemptions} preemption(s))")


def step(chaos: Chaos, plan: Plan, job: dict[str, Any], watch: BedWatch) -> None:
    """Preempt or cancel the job when its plan says so."""
    status, attempt = job["status"], job["attempts"]
    plan.cluster = job["cluster"]
    if status in FINAL or status == "CANCELLING":
        return
    now = chaos.now()
    want_cancel = plan.kind.partition(":")[2]
    # Cancelled once every planned preemption is done: in RECOVERING right after the last
    # one, in RUNNING once its next attempt runs.
    # (A RECOVERING missed between two looks is cancelled in RUNNING instead.)
    if plan.cancel_due is None and plan.cancelled_in is None and (
            (want_cancel == "RECOVERING" and plan.preempted
             and (status == "RECOVERING" or attempt > plan.preemptions))
            or (want_cancel == "RUNNING" and status == "RUNNING"
                and attempt > plan.preemptions)):
        plan.cancel_due = now + chaos.delays.uniform(0, 3)
    if plan.cancel_due is not None and now >= plan.cancel_due and plan.cancelled_in is None:
        if chaos.ctl("jobs", "cancel", str(plan.job_id)) is not None:
            plan.cancelled_in = status
            chaos.note(f"{plan.name}: cancelled while {status}")
        return
    if status != "RUNNING" or attempt > plan.preemptions or attempt in plan.preempted:
        plan.preempt_due = None
        return
    if plan.preempt_due is None:
        text = chaos.ctl("jobs", "logs", str(plan.job_id), "--no-follow")
        if text is not None and f"start {attempt} " in text:
            plan.preempt_due = now + chaos.delays.uniform(0, 4)
        return
    if now >= plan.preempt_due:
        ids = watch.alive_of(plan.cluster)
        if not ids:
            return  # the sampler has not seen it yet
        preempted = [i for i in ids if chaos.ec2.testbed("preempt", i).returncode == 0]
        if preempted:
            plan.preempted.append(attempt)
            plan.preempt_due = None
            chaos.figures["preemptions"] += 1
            chaos.note(f"{plan.name}: attempt {attempt} preempted ({', '.join(preempted)})"
                       + ("" if chaos.up else ", the daemon being down"))


def problems_of(plan: Plan, job: dict[str, Any], text: str,
                events: list[tuple[str | None, str, str]]) -> list[str]:
    """What is wrong with how the job ended, given its plan and what the chaos did to it."""
    found: list[str] = []

    def expect(what: str, got: Any, wanted: Any) -> None:
        if got != wanted:
            found.append(f"{what} is {got!r}, not {wanted!r}")

    p = len(plan.preempted)
    expect("recoveries", job["recoveries"], p)
    if plan.kind == "succeed":
        expect("status", job["status"], "SUCCEEDED")
        expect("attempts", job["attempts"], 1 + p)
        expect("user_restarts", job["user_restarts"], 0)
    elif plan.kind in ("fail0", "fail2"):
        expect("status", job["status"], "FAILED")
        expect("attempts", job["attempts"], 1 + p + plan.restarts)
        expect("user_restarts", job["user_restarts"], plan.restarts)
        if "exit code 3" not in job["status_reason"]:
            found.append(f"the reason does not name exit code 3: {job['status_reason']!r}")
    else:
        expect("status", job["status"], "CANCELLED")
        expect("user_restarts", job["user_restarts"], 0)
        # The status it was in when the cancel landed (its CANCELLING event says; the test's
        # last look may be a moment older).
        cancelled_from = next((f for f, t, _ in events if t == "CANCELLING"), None)
        expect("attempts", job["attempts"], p + (1 if cancelled_from == "RUNNING" else 0))
    if plan.kind in ("succeed", "fail0", "fail2"):
        expect("attempt numbers of the starts in the log",
               re.findall(r"^start (\d+) ", text, re.M),
               [str(n) for n in range(1, job["attempts"] + 1)])
    else:  # an attempt may be cancelled before it prints
        starts = re.findall(r"^start (\d+) ", text, re.M)
        if starts != sorted(set(starts), key=int):
            found.append(f"starts {starts} repeat or are out of order")
    ids = set(re.findall(r"task=(\S+)", text))
    if ids - {job["task_id"]}:
        found.append(f"task ids {sorted(ids)} are not all {job['task_id']}")
    expect("recovery markers", text.count("; recovering ===\n"), p)
    markers = re.findall(r"^=== managed job \d+: attempt (\d+) on ", text, re.M)
    expect("attempt markers", markers, [str(n) for n in range(1, job["attempts"] + 1)])
    if plan.kind == "succeed":
        expect("done lines", re.findall(r"^done (\d+)$", text, re.M), [str(job["attempts"])])
        expect("ticks", re.findall(r"^tick (\S+)$", text, re.M),
               [f"{job['attempts']}.{i}" for i in (1, 2, 3)])
    elif plan.kind in ("fail0", "fail2"):
        expect("failures in the log", re.findall(r"^failing (\d+)$", text, re.M),
               [str(n) for n in range(p + 1, job["attempts"] + 1)])
    # Its status history: one start, one end, a loss per recovery.
    expect("first event", events[0][:2] if events else None, (None, "PENDING"))
    finals = [t for _, t, _ in events if t in FINAL]
    expect("final statuses in its history", finals, [job["status"]])
    lost = [r for f, t, r in events if f == "RUNNING" and t == "RECOVERING" and " lost: " in r]
    expect("losses in its history", len(lost), p)
    return found


def story(daemon: Daemon, job_id: int, job: dict[str, Any], text: str,
          events: list[tuple[str | None, str, str]]) -> str:
    """What happened to a job, for a failure message: its record, its status history, its
    log, and the daemon's own lines about it (not debug)."""
    lines = []
    for line in daemon.log().splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if entry.get("managed_job") == job_id and entry.get("level") != "debug":
            extra = {k: v for k, v in entry.items() if k not in (
                "timestamp", "level", "event", "managed_job", "cluster")}
            lines.append(f"{entry['timestamp'][11:22]} {entry['event']} {json.dumps(extra)}"
                         [:300])
        elif entry.get("event") in ("clusterd ready", "fault point reached: killing the "
                                    "daemon"):
            lines.append(f"{entry['timestamp'][11:22]} -- {entry['event']}")
    history = "\n".join(f"  {before} -> {after}: {reason[:200]}"
                        for before, after, reason in events)
    return (f"\n--- job {job_id}: {json.dumps(job)}\nits history:\n{history}\nits log:\n"
            f"{text[-3000:]}\nthe daemon about it:\n" + "\n".join(lines[-80:]))


def managed_job_events(daemon: Daemon) -> dict[int, list[tuple[str | None, str, str]]]:
    """Every managed job's status changes, from the daemon's database (read only; `jobs`
    has no command that shows them yet)."""
    path = daemon.state_dir / "state.db"
    with contextlib.closing(sqlite3.connect(f"file:{path}?mode=ro", uri=True)) as db:
        rows = db.execute("SELECT job_id, from_status, to_status, reason FROM "
                          "managed_job_events WHERE from_status IS NOT to_status "
                          "ORDER BY id").fetchall()
    events: dict[int, list[tuple[str | None, str, str]]] = {}
    for job_id, before, after, reason in rows:
        events.setdefault(job_id, []).append((before, after, reason))
    return events


@pytest.mark.timeout(3600)
def test_managed_jobs_under_chaos_end_right_and_leave_nothing(ec2: EC2Bed, mchaos: Daemon
                                                              ) -> None:
    print(f"managed chaos: seed {SEED}, {JOBS} jobs; {REPLAY}", file=sys.stderr, flush=True)
    try:
        run_chaos(ec2, mchaos)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n\nmanaged chaos, seed {SEED}; {REPLAY}") from exc


def run_chaos(ec2: EC2Bed, daemon: Daemon) -> None:
    started = time.monotonic()
    plans = make_plans(random.Random(f"{SEED}-plans"), JOBS)
    chaos = Chaos(ec2, daemon, random.Random(f"{SEED}-kills"), started)
    faults = random.Random(f"{SEED}-faults")
    managed_by = (daemon.state_dir / "daemon-id").read_text().strip()
    watch = BedWatch(ec2, managed_by)
    watch.start()
    images = ec2.runtime_images()
    next_faults = chaos.now() + faults.uniform(5, 20)
    deadline = 300 + 90 * JOBS
    jobs: dict[int, dict[str, Any]] = {}
    try:
        while True:
            chaos.tick({j["status"] for j in jobs.values()} - FINAL)
            if chaos.now() >= next_faults:
                apply_faults(ec2, faults, chaos)
                next_faults = chaos.now() + faults.uniform(10, 30)
            out = chaos.ctl("jobs", "queue", "--json", "--all")
            if out is None:
                time.sleep(0.5)
                continue
            jobs = {j["job_id"]: j for j in json.loads(out) if j["name"].startswith("mchaos")}
            unfinished = [p for p in plans if p.job_id is None
                          or jobs.get(p.job_id, {}).get("status") not in FINAL]
            if not unfinished:
                break
            waiting = [p for p in plans if p.job_id is None]
            if waiting and len(unfinished) - len(waiting) < AT_ONCE:
                submit(chaos, waiting[0], images, list(jobs.values()))
            for plan in plans:
                if plan.job_id in jobs:
                    step(chaos, plan, jobs[plan.job_id], watch)
            assert chaos.now() < deadline, (
                f"not every job ended within {deadline} s: "
                + json.dumps([{k: jobs.get(p.job_id or 0, {}).get(k)
                               for k in ("job_id", "name", "status", "status_reason")}
                              for p in unfinished]) + f"\n{daemon.log()[-6000:]}")
            time.sleep(1)
        ec2.clear_faults()
        chaos.settle()
        finished = chaos.now()
        # The bed: nothing of ours left, and never two launches of one job alive at once;
        # the watcher's last word is a sample (or a failed one) begun after the end.
        tried = watch.samples + len(watch.errors)
        wait_for(lambda: watch.samples + len(watch.errors) >= tried + 2, 60,
                 "the bed watcher's samples after the end")
    finally:
        watch.close()
    figures = dict(chaos.figures, jobs=JOBS, seconds=round(finished),
                   samples=watch.samples, most_instances_alive=watch.most_alive)
    print(f"\nmanaged chaos (seed {SEED}): {json.dumps(figures)}")
    print("\n".join(chaos.log))
    assert not watch.errors[:1], f"the bed did not answer {len(watch.errors)} samples: " \
        f"{watch.errors[:3]}"
    # Two a second were asked for; the bed answers slower while its watcher boots nodes.
    assert watch.samples * 3 > finished, (watch.samples, finished)
    assert watch.doubles == [], f"a job had two clusters at once: {watch.doubles[:10]}"
    state = ec2.aws()
    ours = [i for i in state["instances"] if i["tags"].get("clusterd-managed-by") == managed_by]
    assert [i["id"] for i in ours if i["state"] != "terminated"] == []
    assert [g["id"] for g in state["groups"]
            if g["tags"].get("clusterd-managed-by") == managed_by] == []

    # Every job: in `queue --all`, ended as its plan and the chaos say.
    jobs = {j["job_id"]: j for j in json.loads(daemon.ctl("jobs", "queue", "--json",
                                                          "--all").stdout)}
    assert sorted(jobs) == sorted(p.job_id for p in plans if p.job_id is not None)
    assert len(jobs) == JOBS
    history = managed_job_events(daemon)
    problems, details = [], []
    for plan in plans:
        assert plan.job_id is not None
        job = jobs[plan.job_id]
        text = daemon.ctl("jobs", "logs", str(plan.job_id), "--no-follow").stdout
        found = problems_of(plan, job, text, history.get(plan.job_id, []))
        problems += [f"job {plan.job_id} ({plan.name}, {plan.kind}, preempted at attempts "
                     f"{plan.preempted}): {problem}" for problem in found]
        if found:
            details.append(story(daemon, plan.job_id, job, text,
                                 history.get(plan.job_id, [])))
    assert problems == [], "\n".join(problems + details)

    # Every record accounted for: no cluster of theirs, every cluster record made was
    # ended, no request left running.
    clusters = {p.cluster for p in plans}
    assert [c["name"] for c in daemon.status() if c["name"] in clusters] == []
    events = json.loads(daemon.ctl("events", "--json", "-n", "10000").stdout)
    made = Counter(e["cluster"] for e in events if e["cluster"] in clusters
                   and e["kind"] == "status" and e["from_status"] is None)
    ended = Counter(e["cluster"] for e in events if e["cluster"] in clusters
                    and e["to_status"] == "TERMINATED")
    assert made == ended, "cluster records made and ended differ:\n" + "\n".join(
        f"{e['ts']:.2f} {e['cluster']} {e['kind']} {e['from_status']} -> {e['to_status']} "
        f"(request {e.get('request_id')}): {e['reason'][:160]}"
        for e in events if e["cluster"] in {c for c in clusters if made[c] != ended[c]})
    assert sum(made.values()) >= JOBS - sum(1 for p in plans if p.kind == "cancel:STARTING")
    requests = json.loads(daemon.ctl("requests", "--json").stdout)
    assert requests["running"] == [], requests
