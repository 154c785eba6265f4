"""The dashboard's cost (issue 39 §2, §3's banner) against a real daemon on the ssh bed, its
pool priced, in headless Chromium: the Cost page's numbers (from the real ledger, within the
bounds the test measured around the launch and the page load), its charts, spenders, idle
share, burn rate and budget; a cluster's and a managed job's cost on their pages; and the
budget banner, absent under the budget, a warning past warn_at, an error once exceeded (on
an open page, live), and gone again when the budget is raised. Every page at 400 px too.

Screenshots go to $CLUSTERD_DASH_SHOTS when set (to look at), else to the test's tmp dir."""

from __future__ import annotations

import json
import os
import re
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, TypeVar

import pytest
import yaml

from clusterctl.dashboard._costdata import REPORT_MAX_AGE_S
from tests.e2e.dashboard_support import chromium, running_dashboard
from tests.e2e.sshbed import Bed, ssh_bed
from tests.support import wait_for

pytestmark = pytest.mark.ray

PRICE = 36.0  # dollars per host and hour: a cent a second, so seconds show
RATE_S = PRICE / 3600
POLL_S = 30  # the budget controller's look at each budget (cost/budget_controller.py)
BUDGET_WAIT_S = 2 * POLL_S + 30
NARROW_PX = 400

T = TypeVar("T")


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(2) as made:
        made.price_pool(PRICE)
        yield made


def set_budget(bed: Bed, **budget: Any) -> None:
    path = Path(bed.daemon.env["XDG_CONFIG_HOME"]) / "clusterd" / "config.yaml"
    path.write_text(yaml.safe_dump({"budget": budget}))


def managed_job(bed: Bed, job_id: int) -> dict[str, Any]:
    jobs = json.loads(bed.daemon.ctl("jobs", "queue", "--all", "--json").stdout)
    return dict(next(j for j in jobs if j["job_id"] == job_id))


def test_cost_page_cluster_and_job_costs_and_the_budget_banner(bed: Bed, tmp_path: Path
                                                               ) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = Path(os.environ.get("CLUSTERD_DASH_SHOTS") or tmp_path / "shots")
    shots.mkdir(parents=True, exist_ok=True)
    ctl = bed.daemon.ctl
    set_budget(bed, monthly=1e6, warn_at=0.8, action="warn")

    before_launch = time.time()
    launch = ctl("launch", "-c", "spend", "--infra", "ssh/testbed", "--", "echo hi",
                 timeout=900)
    assert launch.returncode == 0, launch.stderr + bed.daemon.log()[-3000:]
    launched = time.time()
    submitted = ctl("jobs", "launch", "-d", "--infra", "ssh/testbed", "-n", "mjcost", "--",
                    "sleep 3000")
    assert submitted.returncode == 0, submitted.stderr
    job_id = max(j["job_id"] for j in json.loads(ctl("jobs", "queue", "--json").stdout))
    wait_for(lambda: managed_job(bed, job_id)["status"] == "RUNNING", 900,
             "the managed job to run")

    with chromium(tmp_path / "profile") as browser, running_dashboard(bed.daemon) as dashboard:
        wait = WebDriverWait(browser, 60, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException])

        def shot(name: str) -> None:
            assert browser.save_screenshot(str(shots / f"{name}.png"))

        def css(selector: str) -> list[Any]:
            return list(browser.find_elements(By.CSS_SELECTOR, selector))

        def fresh(read: Callable[[], T]) -> T:
            """`read` again if a live update replaced the element it was reading (the
            cluster, managed-job and cost parts are redrawn while a page is open)."""
            for _ in range(10):
                try:
                    return read()
                except StaleElementReferenceException:
                    continue
            return read()

        def text(selector: str) -> str:
            return fresh(lambda: str(css(selector)[0].text))

        def attr(selector: str, name: str) -> str:
            return fresh(lambda: str(css(selector)[0].get_attribute(name)))

        def dollars(selector: str) -> float:
            return float(attr(selector, "data-dollars"))

        def banners() -> list[str]:
            return fresh(lambda: [str(b.get_attribute("data-banner"))
                                  for b in css("#banner .banner")])

        browser.get(dashboard.url)
        wait.until(lambda _: css('tr[data-cluster="spend"]'))
        assert banners() == []  # under its budget: no banner

        # The Cost page, its first report fetched as it loads: between the test's clocks.
        asked = time.time()
        browser.get(f"{dashboard.base}/cost?days=7")
        answered = time.time()
        wait.until(lambda _: css("#cost-total"))
        assert banners() == []
        spend_cost = dollars('tr[data-spender="spend"] td.cost')
        assert RATE_S * (asked - launched) <= spend_cost <= RATE_S * (answered - before_launch)
        total = dollars("#cost-total .figure-value")
        assert spend_cost < total <= 2 * RATE_S * (answered - before_launch)
        assert dollars("#cost-burn .figure-value") == pytest.approx(2 * PRICE)
        assert "$72.00/h" in text("#cost-burn")
        # The split: its parts add up to the cost; the cluster sat idle since its launch's
        # job ended, and that stands out.
        parts = {td.get_attribute("data-part"): float(td.get_attribute("data-dollars"))
                 for td in css('tr[data-spender="spend"] td[data-part]')}
        assert sum(parts.values()) == pytest.approx(spend_cost, rel=1e-3)
        assert parts["idle"] > 0 and css('tr[data-spender="spend"] td.idle-cost')
        idle_text = text("#cost-idle .figure-value")
        assert re.fullmatch(r"idle: \$[\d.,]+ \((\d+|<1) % of spend\)", idle_text), idle_text
        assert "has-idle" in attr("#cost-idle", "class")
        # Spend per day: 8 days drawn for 7 back (today's part included), every bar ssh's,
        # adding up to the total; by cluster, both clusters.
        provider_days = css("#chart-provider g.cost-day")
        assert len(provider_days) == 8
        drawn = sum(float(g.get_attribute("data-cost")) for g in provider_days)
        assert drawn == pytest.approx(total, rel=1e-3)
        assert {r.get_attribute("data-series") for r in css("#chart-provider rect")} == {"ssh"}
        series = {r.get_attribute("data-series") for r in css("#chart-cluster rect")}
        assert "spend" in series and len(series) == 2, series
        row = text(f'tr[data-managed-spender="{job_id}"]')
        assert "mjcost" in row and "$0" in row  # one attempt, no recovery
        budget = css('tr[data-budget="*"]')[0]
        assert budget.get_attribute("data-level") == "clear"
        assert "/ $1,000,000.00" in budget.text
        assert "at this rate the budget is not reached this month" in budget.text
        shot("cost-page")
        browser.set_window_size(1300, 2400)  # the whole page, to look at
        shot("cost-page-whole")
        browser.set_window_size(1300, 1000)

        # The range: a day.
        css('.range a[href="/cost?days=1"]')[0].click()
        wait.until(lambda _: "Spent in the last 1 day" in text("#cost-total"))
        assert len(css("#chart-provider g.cost-day")) == 2  # yesterday's part and today

        # A cluster's page: its $/h, its cost so far, its split.
        asked = time.time()
        browser.get(f"{dashboard.base}/clusters/spend")
        answered = time.time()
        wait.until(lambda _: css("#cluster-cost-so-far"))
        assert text("#cluster-rate") == "$36.00/h"
        so_far = dollars("#cluster-cost-so-far")
        assert RATE_S * (asked - REPORT_MAX_AGE_S - launched) <= so_far <= RATE_S * (
            answered - before_launch)
        assert css("#cluster-cost-facts span.idle-cost")
        assert "ssh pool testbed price_per_hour" in text("#cluster-cost-facts")
        shot("cluster-cost")

        # Its launch's job (#1): its share, some of the cluster's cost and no more.
        browser.get(f"{dashboard.base}/clusters/spend/jobs/1")
        wait.until(lambda _: css("#job-cost-so-far"))
        assert 0 < dollars("#job-cost-so-far") < so_far

        # The managed job's page: its cost so far, and that no recovery cost anything.
        job = managed_job(bed, job_id)
        browser.get(f"{dashboard.base}/managed-jobs/{job_id}")
        wait.until(lambda _: css("#managed-cost-so-far"))
        cost = dollars("#managed-cost-so-far")
        assert 0 < cost <= RATE_S * (time.time() - float(job["submitted_at"]))
        assert dollars("#managed-recoveries") == 0
        assert len(css("tr[data-attempt-cost]")) == 1
        shot("managed-job-cost")

        def cost_page_budget_says(level: str) -> None:
            """The Cost page's budget row says `level` once its report is fresh: the page
            shares a report for REPORT_MAX_AGE_S, the banner reads the notices apart."""
            def says() -> bool:
                browser.get(f"{dashboard.base}/cost")
                return attr('tr[data-budget="*"]', "data-level") == level

            WebDriverWait(browser, REPORT_MAX_AGE_S + 15, poll_frequency=1).until(
                lambda _: says())

        # Past warn_at: the banner comes to the open cluster page by itself, as a warning
        # that says what `clusterctl` says, and links to the Cost page.
        browser.get(f"{dashboard.base}/clusters/spend")
        wait.until(lambda _: css("#cluster-cost-so-far"))
        set_budget(bed, monthly=1000, warn_at=0.00001, action="warn")
        WebDriverWait(browser, BUDGET_WAIT_S, poll_frequency=0.5).until(
            lambda _: banners() == ["warn"])
        notice = ctl("status").stderr
        banner = css("#banner .banner")[0]
        assert "of $1000 spent" in banner.text and "of $1000 spent" in notice, notice
        assert banner.find_element(By.TAG_NAME, "a").get_attribute("href").endswith("/cost")
        shot("banner-warn")
        cost_page_budget_says("warned")
        assert banners() == ["warn"]

        # Exceeded: an error (action warn: the clusters run on, new launches are refused).
        set_budget(bed, monthly=0.001, warn_at=0.5, action="warn")
        WebDriverWait(browser, BUDGET_WAIT_S, poll_frequency=0.5).until(
            lambda _: banners() == ["error"])
        assert "budget exceeded" in text("#banner .banner")
        cost_page_budget_says("exceeded")
        shot("banner-exceeded")

        # 400 px wide: no page is wider than the window, the banner included.
        browser.set_window_size(NARROW_PX, 900)
        width = browser.execute_script("return window.innerWidth")
        for path, name in (("/cost", "narrow-cost"), ("/clusters/spend", "narrow-cluster"),
                           (f"/managed-jobs/{job_id}", "narrow-managed-job")):
            browser.get(dashboard.base + path)
            wait.until(lambda _: css("#banner .banner"))
            overflow = browser.execute_script("return document.documentElement.scrollWidth")
            assert overflow <= width, (path, overflow, width)
            shot(name)

        # Raised again: the banner goes from the open page.
        set_budget(bed, monthly=1e6, warn_at=0.8, action="warn")
        WebDriverWait(browser, BUDGET_WAIT_S, poll_frequency=0.5).until(
            lambda _: banners() == [])

        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"]
        assert not errors, errors
    ctl("jobs", "cancel", "--all")
