"""The dashboard's managed-jobs pages against a real daemon running a real managed job on the
`local` provider: the list, the job (record, attempts, events, live log), the link from its
cluster, and cancel from the page (the job ends CANCELLED and its cluster is gone); over plain
HTTP (what is sent, what the guard refuses) and in headless Chromium."""

from __future__ import annotations

import contextlib
import html
import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from tests.e2e.dashboard_support import chromium, running_dashboard
from tests.support import Daemon, wait_for

# A job that prints a coloured line every 0.3 s for a few minutes (cancelled long before).
TICKER = 'for i in $(seq 1 600); do printf "\\033[32mtick\\033[0m %d\\n" $i; sleep 0.3; done'
MARKER = re.compile(r"=== managed job (\d+): attempt 1 on (\S+) ")
# A managed job's cluster is launched like any other (Ray started on this machine): seconds,
# more on a busy machine.
LAUNCH_TIMEOUT_S = 120
CANCEL_TIMEOUT_S = 60


def managed_jobs(daemon: Daemon) -> list[dict[str, Any]]:
    result = daemon.ctl("jobs", "queue", "--all", "--json")
    assert result.returncode == 0, result.stderr
    jobs: list[dict[str, Any]] = json.loads(result.stdout)
    return jobs


def managed_job(daemon: Daemon, job_id: int) -> dict[str, Any]:
    return next(j for j in managed_jobs(daemon) if j["job_id"] == job_id)


@contextlib.contextmanager
def managed_ticker(daemon: Daemon, name: str) -> Iterator[tuple[int, str]]:
    """A managed job on a `local` cluster of its own, submitted (not yet running); at the end
    every managed job is cancelled and its cluster gone, whatever the test did."""
    result = daemon.ctl("jobs", "launch", "-d", "--infra", "local", "-n", name, "--", TICKER)
    assert result.returncode == 0, result.stderr
    job = managed_jobs(daemon)[0]
    assert job["name"] == name, job
    try:
        yield int(job["job_id"]), str(job["cluster"])
    finally:
        daemon.ctl("jobs", "cancel", "--all")
        wait_for(lambda: all(j["ended_at"] for j in managed_jobs(daemon)), CANCEL_TIMEOUT_S,
                 "every managed job to end")
        assert daemon.status() == [], "a managed job's cluster was left"


def wait_running(daemon: Daemon, job_id: int) -> dict[str, Any]:
    def running() -> dict[str, Any] | None:
        job = managed_job(daemon, job_id)
        assert not job["ended_at"], job
        return job if job["status"] == "RUNNING" else None
    found: dict[str, Any] = wait_for(running, LAUNCH_TIMEOUT_S, "the managed job to run",
                                     interval=0.3)
    return found


def row(page: str, attribute: str, value: object) -> str:
    match = re.search(rf'<tr {attribute}="{value}">(.*?)</tr>', page, re.S)
    assert match, f"no row {attribute}={value} in {page[:3000]}"
    return match.group(1)


def log_text(events: list[tuple[str, Any, str]]) -> str:
    """What a page's log shows of these live events, as text."""
    shown = "".join(data["html"] for name, data, _ in events if name == "log")
    return html.unescape(re.sub(r"<[^>]+>", "", shown))


def ticks(text: str) -> list[int]:
    return [int(n) for n in re.findall(r"^tick (\d+)$", text, re.M)]


# -- over HTTP ---------------------------------------------------------------------------------


def test_managed_job_pages_live_log_and_cancel_over_http(daemon: Daemon) -> None:
    with managed_ticker(daemon, "ticker") as (job_id, cluster), \
            running_dashboard(daemon) as dashboard:
        jar = {"Cookie": dashboard.cookie()}
        origin = {"Origin": dashboard.base}

        # Every page links to the list; the list shows the job from its submission on.
        status, _, page = dashboard.http("GET", "/", jar)
        assert status == 200 and '<a href="/managed-jobs"' in page
        status, _, page = dashboard.http("GET", "/managed-jobs", jar)
        assert status == 200, page
        assert f'<a href="/managed-jobs/{job_id}">{job_id}</a>' in row(
            page, "data-managed-job", job_id)
        # ... and follows it, live, until it runs.
        dashboard.live("/live/managed-jobs", jar, lambda name, data: name == "replace"
                       and data["id"] == "managed-jobs" and ">RUNNING<" in data["html"],
                       timeout=LAUNCH_TIMEOUT_S)
        job = wait_running(daemon, job_id)

        # The list: id, name, status, where it runs, its cluster, recoveries, last reason,
        # and a cancel button.
        _, _, page = dashboard.http("GET", "/managed-jobs", jar)
        cells = row(page, "data-managed-job", job_id)
        for shown in ("<td>ticker</td>", '<span class="status run">RUNNING</span>',
                      f'local <a class="muted" href="/clusters/{cluster}">{cluster}</a>',
                      "<td>0</td>", f"attempt 1 running on {cluster}",
                      f'data-since="{job["submitted_at"]}"',
                      f'data-action="/api/managed-jobs/{job_id}/cancel"'):
            assert shown in cells, (shown, cells)

        # The job: its record, its one attempt, its events.
        status, _, page = dashboard.http("GET", f"/managed-jobs/{job_id}", jar)
        assert status == 200, page
        assert 'id="managed-job-state" data-status="RUNNING"' in page
        assert job["task_id"] in page and f'href="/clusters/{cluster}"' in page
        attempt = row(page, "data-attempt", 1)
        assert f"attempt 1 running on {cluster}" in attempt and "running</span>" in attempt
        assert "STARTING → RUNNING" in page and "- → PENDING" in page
        assert 'id="cancel-managed-job"' in page
        after = max(int(n) for n in re.findall(r'<tr data-event="(\d+)">', page))

        # The status page and the cluster's page link the cluster to its job, and offer no
        # teardown of it (cancelling the job is the way).
        _, _, page = dashboard.http("GET", "/", jar)
        cells = row(page, "data-cluster", cluster)
        assert f'href="/managed-jobs/{job_id}">managed job {job_id}</a>' in cells
        assert 'data-do="down"' not in cells and 'data-do="stop"' not in cells
        _, _, page = dashboard.http("GET", f"/clusters/{cluster}", jar)
        assert f'<a href="/managed-jobs/{job_id}">{job_id}</a>' in page

        # The live log: the job's output as it comes, coloured, after its attempt's marker;
        # each message carries the byte offset it reaches.
        live = f"/live/managed-jobs/{job_id}?after={after}"
        collected: list[tuple[str, Any, str]] = []

        def enough_ticks(name: str, data: Any) -> bool:
            collected.append((name, data, ""))
            return len(ticks(log_text(collected))) >= 3

        first = dashboard.live(live, jar, enough_ticks, timeout=30)
        text = log_text(first)
        match = MARKER.search(text)
        assert match and match.groups() == (str(job_id), cluster), text
        assert ticks(text) == list(range(1, len(ticks(text)) + 1)), text
        assert '<span class="f2">tick</span>' in "".join(
            d["html"] for n, d, _ in first if n == "log")
        assert "\x1b" not in text
        reached = [event_id for name, _, event_id in first if name == "log"][-1]
        assert int(reached) >= len(text.encode())

        # A page that reconnects (its browser sends the last offset it had) gets only what
        # came after.
        resumed = dashboard.live(live, {**jar, "Last-Event-ID": reached},
                                 lambda name, data: name == "log", timeout=30)
        text = log_text(resumed)
        assert "=== managed job" not in text and ticks(text), text
        assert ticks(text)[0] == ticks(log_text(first))[-1] + 1, (text, log_text(first))

        # The whole log, as text.
        status, headers, text = dashboard.http("GET", f"/managed-jobs/{job_id}/log.txt", jar)
        assert status == 200 and headers["content-type"].startswith("text/plain")
        assert MARKER.search(text) and "tick 1\n" in text and "\x1b" not in text

        # Cancel, from another origin or none: refused, and the job runs on.
        cancel = f"/api/managed-jobs/{job_id}/cancel"
        for bad in ({}, {"Origin": "http://evil.example"}):
            status, _, text = dashboard.http("POST", cancel, {**jar, **bad}, "{}")
            assert status == 403 and "origin" in text, (bad, text)
        assert dashboard.http("POST", cancel, origin, "{}")[0] == 403  # no cookie
        assert managed_job(daemon, job_id)["status"] == "RUNNING"

        # Cancel from its own page: the live stream follows the job to CANCELLED, and ends.
        status, _, text = dashboard.http("POST", cancel, {**jar, **origin}, "{}")
        assert status == 200, text
        assert json.loads(text) == {"ok": True, "message": f"Managed job {job_id}: "
                                    "cancelling (its cluster is torn down)."}
        end = dashboard.live(live, jar, lambda name, data: name == "done",
                             timeout=CANCEL_TIMEOUT_S)
        assert end[-1][:2] == ("done", {"status": "CANCELLED"}), end[-5:]
        states = [re.search(r'data-status="(\w+)"', d["html"]).group(1)  # type: ignore[union-attr]
                  for n, d, _ in end if n == "replace" and d["id"] == "managed-job"]
        assert states[-1] == "CANCELLED", states
        prepended = "".join(d["html"] for n, d, _ in end if n == "prepend")
        assert "RUNNING → CANCELLING" in prepended and "CANCELLING → CANCELLED" in prepended
        assert managed_job(daemon, job_id)["status"] == "CANCELLED"
        assert daemon.cluster(cluster) is None

        # Ended: the list and the page say so, and offer no cancel; cancelling again says it
        # had ended; an id no job has is a 404 page and an error with the daemon's code.
        _, _, page = dashboard.http("GET", "/managed-jobs", jar)
        cells = row(page, "data-managed-job", job_id)
        assert '<span class="status off">CANCELLED</span>' in cells and "<button" not in cells
        _, _, page = dashboard.http("GET", f"/managed-jobs/{job_id}", jar)
        assert 'data-status="CANCELLED"' in page and 'id="cancel-managed-job"' not in page
        assert "CANCELLED" in row(page, "data-attempt", 1)
        status, _, text = dashboard.http("POST", cancel, {**jar, **origin}, "{}")
        assert json.loads(text)["message"] == f"Managed job {job_id} has already ended."
        status, _, page = dashboard.http("GET", "/managed-jobs/4242", jar)
        assert status == 404 and "MANAGED_JOB_NOT_FOUND" in page
        status, _, text = dashboard.http("POST", "/api/managed-jobs/4242/cancel",
                                         {**jar, **origin}, "{}")
        assert status == 400 and json.loads(text)["error"]["code"] == "MANAGED_JOB_NOT_FOUND"


# -- in the browser ----------------------------------------------------------------------------


def test_managed_job_in_the_browser(daemon: Daemon, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = tmp_path / "screenshots"
    shots.mkdir()
    with managed_ticker(daemon, "web-ticker") as (job_id, cluster), \
            chromium(tmp_path / "profile") as browser, \
            running_dashboard(daemon) as dashboard:
        wait = WebDriverWait(browser, 60, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException])

        def click(by: str, selector: str) -> None:
            wait.until(lambda b: b.find_element(by, selector).click() or True)

        def text_of(by: str, selector: str) -> str:
            return str(browser.find_element(by, selector).text)

        def shot(name: str) -> None:
            assert browser.save_screenshot(str(shots / f"{name}.png"))

        browser.get(dashboard.url)
        click(By.LINK_TEXT, "Managed jobs")
        job_row = f'tr[data-managed-job="{job_id}"]'
        wait.until(lambda b: "web-ticker" in text_of(By.CSS_SELECTOR, job_row))
        shot("managed-jobs-starting")

        # The job, opened while its cluster is being launched: it follows the job to RUNNING,
        # with its attempt, its events, and its log growing as we watch (no reload).
        click(By.CSS_SELECTOR, f'{job_row} a[href="/managed-jobs/{job_id}"]')
        state = (By.ID, "managed-job-state")
        drawn_as = wait.until(lambda b: b.find_element(*state).get_attribute("data-status"))
        page = browser.execute_script("return performance.timeOrigin")
        wait_running(daemon, job_id)
        wait.until(lambda b: b.find_element(*state).get_attribute("data-status") == "RUNNING")
        wait.until(lambda b: f"attempt 1 running on {cluster}" in text_of(
            By.CSS_SELECTOR, 'tr[data-attempt="1"]'))
        wait.until(lambda b: "STARTING → RUNNING" in text_of(By.ID, "events"))
        log = wait.until(lambda b: b.find_element(By.ID, "log"))
        wait.until(lambda _: len(ticks(log.text)) >= 3)
        assert MARKER.search(log.text), log.text
        green = log.find_elements(By.CSS_SELECTOR, "span.f2")
        assert green and green[0].text == "tick"
        shot("managed-job")

        # The daemon restarts under the open page: the job runs on, and the page reconnects
        # by itself, its log going on where it was (nothing twice, nothing missed), its
        # events drawn once each.
        seen = len(ticks(log.text))
        assert daemon.stop() == 0
        daemon.start()
        wait.until(lambda _: len(ticks(log.text)) >= seen + 5)
        shown = log.text  # read once: the page goes on appending ticks
        assert ticks(shown) == list(range(1, len(ticks(shown)) + 1)), shown
        assert browser.execute_script("return performance.timeOrigin") == page
        rows = [r.get_attribute("data-event") for r in
                browser.find_elements(By.CSS_SELECTOR, "#events tr")]
        assert len(rows) == len(set(rows)) >= 3, (drawn_as, rows)
        assert text_of(By.ID, "events").count("STARTING → RUNNING") == 1

        # The list: RUNNING, where, why.
        click(By.LINK_TEXT, "Managed jobs")
        wait.until(lambda b: "RUNNING" in text_of(By.CSS_SELECTOR, job_row))
        assert f"attempt 1 running on {cluster}" in text_of(By.CSS_SELECTOR, job_row)
        shot("managed-jobs")

        # The status page: the job's cluster, with a link to its job instead of a teardown.
        click(By.LINK_TEXT, "Clusters")
        cluster_row = f'tr[data-cluster="{cluster}"]'
        wait.until(lambda b: f"managed job {job_id}" in text_of(By.CSS_SELECTOR, cluster_row))
        assert not browser.find_elements(By.CSS_SELECTOR, f"{cluster_row} button")
        click(By.CSS_SELECTOR, f'{cluster_row} a[href="/managed-jobs/{job_id}"]')
        wait.until(lambda b: b.find_element(*state).get_attribute("data-status") == "RUNNING")
        log = wait.until(lambda b: b.find_element(By.ID, "log"))
        wait.until(lambda _: len(ticks(log.text)) >= 3)

        # Cancel from the page, confirmed: CANCELLED, its attempt and events say so, the
        # log's stream ends, and the cluster is gone.
        click(By.ID, "cancel-managed-job")
        dialog = wait.until(lambda b: b.find_element(By.ID, "confirm"))
        assert dialog.is_displayed()
        assert f"Cancel managed job {job_id} (web-ticker)?" in dialog.text
        assert f"Its cluster {cluster} is torn down." in dialog.text
        click(By.ID, "confirm-yes")
        wait.until(lambda b: "cancelling" in text_of(By.ID, "notices"))
        wait.until(lambda b: b.find_element(*state).get_attribute("data-status") == "CANCELLED")
        wait.until(lambda b: b.find_element(By.TAG_NAME, "body").get_attribute("data-done")
                   == "1")
        assert not browser.find_elements(By.ID, "cancel-managed-job")
        assert "CANCELLED" in text_of(By.CSS_SELECTOR, 'tr[data-attempt="1"]')
        assert "CANCELLING → CANCELLED" in text_of(By.CSS_SELECTOR, "#events tr")
        assert managed_job(daemon, job_id)["status"] == "CANCELLED"
        assert daemon.cluster(cluster) is None
        shot("managed-job-cancelled")

        # Back on the list: CANCELLED, nothing to cancel.
        click(By.CSS_SELECTOR, 'p.crumbs a[href="/managed-jobs"]')
        wait.until(lambda b: "CANCELLED" in text_of(By.CSS_SELECTOR, job_row))
        assert not browser.find_elements(By.CSS_SELECTOR, f"{job_row} button")

        errors = [e for e in browser.get_log("browser") if e["level"] == "SEVERE"]
        assert not errors, errors  # CSP violations and script errors land here
    for name in ("managed-jobs-starting", "managed-job", "managed-jobs",
                 "managed-job-cancelled"):
        assert (shots / f"{name}.png").stat().st_size > 1000, name
