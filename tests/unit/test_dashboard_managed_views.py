"""What the dashboard's managed-jobs pages draw from the daemon's answers (no daemon, no
browser): attempts from a job's events, durations that tick, and the buttons each state gets."""

from __future__ import annotations

import re
import time
from typing import Any

from clusterctl.dashboard._views import attempts, environment, managed_running_since, seconds


def event(event_id: int, before: str | None, after: str, reason: str) -> dict[str, Any]:
    return {"id": event_id, "ts": 1000.0 + 10 * event_id, "job_id": 7, "from_status": before,
            "to_status": after, "reason": reason}


RECOVERED_THEN_CANCELLED = [
    event(1, None, "PENDING", "submitted"),
    event(2, "PENDING", "STARTING", "launching a cluster"),
    event(3, "STARTING", "RUNNING", "attempt 1 running on mj-7-x"),
    event(4, "RUNNING", "RECOVERING", "cluster mj-7-x lost: node i-1 is terminated"),
    event(5, "RECOVERING", "RECOVERING", "launch failed: no capacity; trying again in 10 s"),
    event(6, "RECOVERING", "RUNNING", "attempt 2 running on mj-7-x"),
    event(7, "RUNNING", "RECOVERING", "attempt 2 FAILED; restart 1 of 1"),
    event(8, "RECOVERING", "RUNNING", "attempt 3 running on mj-7-x"),
    event(9, "RUNNING", "CANCELLING", "cancel requested"),
    event(10, "CANCELLING", "CANCELLED", "cancelled by the user"),
]


def job(**values: Any) -> dict[str, Any]:
    return {"job_id": 7, "name": "x", "status": "RUNNING", "status_reason": "", "cluster":
            "mj-7-x", "task_id": "t", "submitted_at": 1000.0, "started_at": 1030.0,
            "ended_at": None, "total_seconds": 100.0, "job_seconds": 40.0, "attempts": 1,
            "recoveries": 0, "user_restarts": 0, "infra": "local", "resources": None,
            **values}


def test_attempts_begin_on_running_and_end_with_the_next_change_of_status() -> None:
    found = attempts(RECOVERED_THEN_CANCELLED)
    assert [(a["number"], a["outcome"]) for a in found] == [
        (1, "RECOVERING"), (2, "RECOVERING"), (3, "CANCELLED")]
    assert found[0]["started"] == "attempt 1 running on mj-7-x"
    assert found[0]["reason"] == "cluster mj-7-x lost: node i-1 is terminated"
    assert (found[0]["started_at"], found[0]["ended_at"]) == (1030.0, 1040.0)
    assert found[1]["reason"] == "attempt 2 FAILED; restart 1 of 1"  # the note is no end
    assert found[2]["reason"] == "cancel requested; cancelled by the user"
    running = attempts(RECOVERED_THEN_CANCELLED[:8])
    assert running[-1]["ended_at"] is None and running[-1]["outcome"] is None
    assert attempts(RECOVERED_THEN_CANCELLED[:2]) == []


def test_durations_tick_from_a_time_that_stays_put() -> None:
    assert (seconds(None), seconds(0), seconds(59.9), seconds(3600)) == ("-", "0s", "59s", "1h")
    now = time.time()
    since = managed_running_since(job(job_seconds=40.0))
    assert since is not None and abs(since - (now - 40)) <= 1
    assert managed_running_since(job(job_seconds=40.0)) == since  # the same page, twice
    assert managed_running_since(job(status="RECOVERING")) is None


def test_the_list_offers_cancel_only_while_a_job_can_be_cancelled() -> None:
    env = environment()
    jobs = [job(job_id=1, status="RUNNING"), job(job_id=2, status="CANCELLING"),
            job(job_id=3, status="FAILED_NO_RESOURCE", ended_at=1100.0),
            job(job_id=4, status="PENDING", started_at=None, job_seconds=0.0, infra=None,
                name="<b>bold</b>")]
    page = env.get_template("_managed_jobs.html").render(jobs=jobs)
    rows = dict(re.findall(r'<tr data-managed-job="(\d+)">(.*?)</tr>', page, re.S))
    assert "/api/managed-jobs/1/cancel" in rows["1"] and 'data-elapsed=' in rows["1"]
    assert "<button" not in rows["2"] and "<button" not in rows["3"]
    assert '<span class="status bad">FAILED_NO_RESOURCE</span>' in rows["3"]
    assert "<td>1m</td><td>40s</td>" in rows["3"]  # ended: durations as they were
    assert "/api/managed-jobs/4/cancel" in rows["4"]
    assert "&lt;b&gt;bold&lt;/b&gt;" in rows["4"] and "<b>" not in rows["4"]
    assert "<td>-</td>" in rows["4"]  # it has not run: no job duration, nowhere yet


CLUSTER = {"infra": "local", "status": "UP", "status_reason": "", "busy": [], "num_nodes": 1,
           "cpus": 2.0, "memory_gb": 4.0, "autostop_minutes": None, "autostopping": False,
           "refreshed_at": 1000.0, "price_per_hour": None}


def test_a_managed_jobs_cluster_links_to_it_and_has_no_lifecycle_buttons() -> None:
    env = environment()

    class Overview:
        clusters = [{**CLUSTER, "name": "mj-7-x", "managed_job": 7}, {**CLUSTER, "name": "dev"}]
        orphans: list[Any] = []

    page = env.get_template("_clusters.html").render(overview=Overview())
    rows = dict(re.findall(r'<tr data-cluster="([\w-]+)">(.*?)</tr>', page, re.S))
    assert '<a class="managed-job" href="/managed-jobs/7">managed job 7</a>' in rows["mj-7-x"]
    assert "<button" not in rows["mj-7-x"]
    assert 'data-do="stop"' in rows["dev"] and 'data-do="down"' in rows["dev"]
    assert "managed-jobs" not in rows["dev"]
