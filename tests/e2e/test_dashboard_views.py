"""The dashboard's drawn views against a real daemon and a real `local` cluster, in headless
Chromium: a cluster's timeline (launch phases, jobs as bars, events as marks), its node's use
as sparklines (sampled by the agent), jobs newest first and filtered by name and status, a
log downloaded as a file, a finished request's steps, and every page at 400 px wide.

Screenshots go to $CLUSTERD_DASH_SHOTS when set (to look at), else to the test's tmp dir."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

from tests.e2e.dashboard_support import chromium, running_dashboard
from tests.support import Daemon, wait_for

NARROW_PX = 400


def exec_job(daemon: Daemon, cluster: str, name: str, command: str) -> int:
    result = daemon.ctl("exec", cluster, "-d", "--name", name, "--", command)
    assert result.returncode == 0, result.stderr
    jobs = json.loads(daemon.ctl("queue", cluster, "--json").stdout)
    return int(max(j["job_id"] for j in jobs))


def job_status(daemon: Daemon, cluster: str, job_id: int) -> str:
    jobs = json.loads(daemon.ctl("queue", cluster, "--json").stdout)
    return str(next(j for j in jobs if j["job_id"] == job_id)["status"])


def test_timeline_usage_filters_download_request_steps_and_narrow_pages(
        daemon: Daemon, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    shots = Path(os.environ.get("CLUSTERD_DASH_SHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)

    launched = daemon.ctl("launch", "-c", "tl", "--", "echo ready")
    assert launched.returncode == 0, launched.stderr + daemon.log()[-3000:]
    ok = exec_job(daemon, "tl", "hello", "echo hello; sleep 1")
    bad = exec_job(daemon, "tl", "broken", "echo oops; exit 3")
    running = exec_job(daemon, "tl", "ticker", "for i in $(seq 1 300); do echo t$i; sleep 1; done")
    wait_for(lambda: job_status(daemon, "tl", bad) == "FAILED"
             and job_status(daemon, "tl", ok) == "SUCCEEDED", 120, "two jobs to end")
    wait_for(lambda: job_status(daemon, "tl", running) == "RUNNING", 60, "the ticker to run")
    assert daemon.ctl("autostop", "tl", "-i", "30").returncode == 0
    events = json.loads(daemon.ctl("events", "tl", "--json").stdout)
    launch_request = next(e["request_id"] for e in events if e["request_id"])

    with chromium(tmp_path / "profile") as browser, running_dashboard(daemon) as dashboard:
        wait = WebDriverWait(browser, 90, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException])

        def shot(name: str) -> None:
            assert browser.save_screenshot(str(shots / f"{name}.png"))

        def visible_jobs() -> list[int]:
            return [int(row.get_attribute("data-job")) for row in
                    browser.find_elements(By.CSS_SELECTOR, "#job-table tbody tr")
                    if row.is_displayed()]

        browser.get(dashboard.url)
        wait.until(lambda b: b.find_elements(By.CSS_SELECTOR, 'tr[data-cluster="tl"]'))
        browser.get(f"{dashboard.base}/clusters/tl")

        # The timeline: the cluster's INIT then UP, the launch's phases, each job a bar
        # (coloured by how it ended), the autostop setting as a mark. Live updates redraw it
        # under us: each look is a fresh one.
        def drawn(css: str, attribute: str = "textContent") -> list[str]:
            return [e.get_attribute(attribute) or "" for e in
                    browser.find_elements(By.CSS_SELECTOR, f"#timeline svg {css}")]

        wait.until(lambda _: drawn(".tl-bar.tl-up") and drawn(".tl-bar.tl-init"))
        phases = wait.until(lambda _: drawn(".tl-phase title"))
        assert any("checking where tl can run" in t for t in phases), phases
        assert any("starting Ray" in t for t in phases), phases
        for job_id, css in ((ok, "tl-ok"), (bad, "tl-bad"), (running, "tl-run")):
            assert wait.until(lambda _, j=job_id, c=css: drawn(f'g.tl-job[data-job="{j}"] .{c}'))
        assert "autostop" in drawn("g.tl-mark", "data-kind")

        # The node's use over the last hour, sampled by the agent: a sparkline each for CPU
        # and memory, with the newest value beside it.
        def chart(name: str, css: str = ".usage-value") -> str:
            found = browser.find_elements(By.CSS_SELECTOR, f'#usage [data-chart="{name}"] {css}')
            return found[0].text if found else ""

        wait.until(lambda _: re.fullmatch(r"\d+%", chart("CPU")))
        assert browser.find_elements(By.CSS_SELECTOR,
                                     '#usage [data-chart="CPU"] svg.spark circle.spark-dot')
        assert re.fullmatch(r"[\d.]+ / [\d.]+ GB", chart("Memory")), chart("Memory")
        assert "(head)" in browser.find_element(By.ID, "usage").text
        shot("cluster-timeline-usage")

        # Jobs newest first, as `clusterctl queue` (the launch's own job is the first);
        # filtered by name, then by status.
        assert visible_jobs() == [running, bad, ok, ok - 1]
        search = browser.find_element(By.CSS_SELECTOR, 'form[data-filter="job-table"] '
                                                       'input[name="q"]')
        search.send_keys("Hell")  # any case, any part of the name
        wait.until(lambda _: visible_jobs() == [ok])
        assert "1 of 4" in browser.find_element(By.CSS_SELECTOR, ".filter-count").text
        shot("jobs-filtered-by-name")
        search.clear()
        search.send_keys(" ")  # an input event: the search is empty again
        search.clear()
        Select(browser.find_element(By.CSS_SELECTOR, 'form[data-filter="job-table"] '
                                                     'select')).select_by_visible_text("SUCCEEDED")
        wait.until(lambda _: visible_jobs() == [ok, ok - 1])
        shot("jobs-filtered-by-status")

        # A job's log, downloaded as a file named after it.
        link = browser.find_element(By.CSS_SELECTOR,
                                    f'tr[data-job="{ok}"] a.download').get_attribute("href")
        assert link.endswith(f"/clusters/tl/jobs/{ok}/log.txt?download")
        status, headers, text = dashboard.http("GET", link.removeprefix(dashboard.base),
                                               {"Cookie": dashboard.cookie()})
        assert status == 200 and text == "hello\n", text
        assert headers["content-disposition"] == f'attachment; filename="tl-job-{ok}.log"'
        plain = dashboard.http("GET", f"/clusters/tl/jobs/{ok}/log.txt",
                               {"Cookie": dashboard.cookie()})
        assert "content-disposition" not in plain[1]

        # The clusters list filters too.
        browser.get(dashboard.base + "/")
        box = wait.until(lambda b: b.find_element(By.CSS_SELECTOR,
                                                  'form[data-filter="cluster-table"] input'))
        box.send_keys("nomatch")
        wait.until(lambda b: not b.find_element(By.CSS_SELECTOR,
                                                'tr[data-cluster="tl"]').is_displayed())
        box.clear()
        box.send_keys("t")
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR,
                                            'tr[data-cluster="tl"]').is_displayed())

        # The launch, finished: its page shows how it ended and its steps, with times.
        browser.get(f"{dashboard.base}/requests/{launch_request}")
        wait.until(lambda b: "SUCCEEDED" in b.find_element(By.ID, "request-facts").text)
        progress = wait.until(lambda b: b.find_element(By.ID, "progress"))
        wait.until(lambda _: "cluster tl is UP" in progress.text)
        assert "checking where tl can run" in progress.text
        assert re.search(r"\[\s+\d+\.\ds\] starting Ray", progress.text), progress.text
        shot("request-finished")

        # 400 px wide: no page is wider than the window (tables scroll inside it).
        browser.set_window_size(NARROW_PX, 900)
        width = browser.execute_script("return window.innerWidth")
        for path, name, ready in (("/", "narrow-clusters", "clusters"),
                                  ("/clusters/tl", "narrow-cluster", "timeline"),
                                  (f"/clusters/tl/jobs/{running}", "narrow-job", "log"),
                                  ("/events", "narrow-events", "events")):
            browser.get(dashboard.base + path)
            wait.until(lambda b, ready=ready: b.find_element(By.ID, ready))
            overflow = browser.execute_script(
                "return document.documentElement.scrollWidth")
            assert overflow <= width, (path, overflow, width)
            shot(name)

        errors: list[dict[str, Any]] = [entry for entry in browser.get_log("browser")
                                        if entry["level"] == "SEVERE"]
        assert not errors, errors
    daemon.ctl("cancel", "tl", str(running))
