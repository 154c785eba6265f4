"""The dashboard's history (issue 38, part 4's history view) in headless Chromium: a link to a
cluster that was torn down lands on its history (infra, why it went, its jobs) instead of an
error, the history page lists it, and its job's kept log opens as text."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.e2e.dashboard_support import chromium, running_dashboard
from tests.support import Daemon

pytestmark = pytest.mark.ray


def test_a_gone_clusters_link_shows_its_history_and_kept_log(daemon: Daemon,
                                                              tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    launch = daemon.ctl("launch", "-c", "bygone", "--", "echo kept for later")
    assert launch.returncode == 0, launch.stderr + daemon.log()[-3000:]
    assert daemon.ctl("down", "-y", "bygone").returncode == 0
    shots = Path(os.environ.get("CLUSTERD_TEST_SHOTS", tmp_path / "screenshots"))
    shots.mkdir(parents=True, exist_ok=True)

    with chromium(tmp_path / "profile") as browser, running_dashboard(daemon) as dashboard:
        wait = WebDriverWait(browser, 60, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException])
        browser.get(dashboard.url)  # the one-time link: in, with a cookie

        browser.get(f"{dashboard.base}/clusters/bygone")
        wait.until(lambda b: "torn down" in b.find_element(By.TAG_NAME, "h1").text)
        section = browser.find_element(By.CSS_SELECTOR, 'section[data-history="bygone"]')
        assert "local" in section.text and "torn down by request" in section.text
        row = section.find_element(By.CSS_SELECTOR, 'tr[data-job="1"]')
        assert "SUCCEEDED" in row.text and "complete" in row.text
        assert browser.save_screenshot(str(shots / "history-cluster.png"))

        browser.get(f"{dashboard.base}/history")
        wait.until(lambda b: b.find_element(By.LINK_TEXT, "bygone"))
        assert "current" in browser.find_element(By.LINK_TEXT, "History").get_attribute(
            "class")
        assert browser.save_screenshot(str(shots / "history.png"))

        browser.get(f"{dashboard.base}/history/bygone")
        browser.find_element(By.CSS_SELECTOR, 'tr[data-job="1"] a.kept-log').click()
        wait.until(lambda b: "kept for later" in b.find_element(By.TAG_NAME, "body").text)

        # A cluster that never existed is still an error, not an empty history.
        browser.get(f"{dashboard.base}/clusters/never-was")
        wait.until(lambda b: "Error" in b.find_element(By.TAG_NAME, "h1").text)
