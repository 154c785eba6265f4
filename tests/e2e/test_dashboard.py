"""`clusterctl dashboard` against a real daemon and a real `local` cluster: in headless Chromium
(watch a job's log grow, cancel it, tear the cluster down, all from the pages), and over plain
HTTP for what it must refuse (no token, a foreign Host, a foreign Origin)."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
from pathlib import Path
from typing import Any

import pytest

from clusterctl.client import Client, DaemonUnavailable
from clusterctl.protocol import PingArgs
from tests.e2e.dashboard_support import (
    URL,
    chromium,
    running_dashboard,
    start_dashboard,
    stop_dashboard,
)
from tests.support import Daemon, daemons_of, pid_alive, wait_for

# A job that prints a coloured line every 0.3 s for a few minutes (cancelled long before).
TICKER = 'for i in $(seq 1 600); do printf "\\033[32mtick\\033[0m %d\\n" $i; sleep 0.3; done'


def job_status(daemon: Daemon, cluster: str, job_id: int) -> str:
    result = daemon.ctl("queue", cluster, "--json")
    assert result.returncode == 0, result.stderr
    return str(next(j for j in json.loads(result.stdout) if j["job_id"] == job_id)["status"])


def submit_ticker(daemon: Daemon, cluster: str) -> int:
    result = daemon.ctl("exec", cluster, "-d", "--", TICKER)
    assert result.returncode == 0, result.stderr
    jobs = json.loads(daemon.ctl("queue", cluster, "--json").stdout)
    return int(max(j["job_id"] for j in jobs))


# -- in the browser ----------------------------------------------------------------------------


def test_watch_cancel_and_tear_down_in_the_browser(daemon: Daemon, tmp_path: Path) -> None:
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    shots = tmp_path / "screenshots"
    shots.mkdir()

    # The browser first: the printed link is good for seconds, as when one opens it at once.
    with chromium(tmp_path / "profile") as browser, running_dashboard(daemon) as dashboard:
        # Live updates replace parts of the page under us: look elements up afresh.
        wait = WebDriverWait(browser, 60, poll_frequency=0.2,
                             ignored_exceptions=[StaleElementReferenceException])

        def click(by: str, selector: str) -> None:
            wait.until(lambda b: b.find_element(by, selector).click() or True)

        def shot(name: str) -> None:
            assert browser.save_screenshot(str(shots / f"{name}.png"))

        # The printed link lets us in (its code is traded for a cookie, dropped from the bar).
        browser.get(dashboard.url)
        assert "code=" not in browser.current_url
        wait.until(lambda b: "No clusters" in b.find_element(By.ID, "clusters").text)

        # A launch from the terminal: the page shows it in flight, with its progress.
        launch = daemon.popen_ctl("launch", "-c", "web", "--", "echo ready")
        request_row = 'tr[data-request] td:nth-child(2)'
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, request_row).text == "launch")
        progress_cell = 'tr[data-request] td:nth-child(5)'
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, progress_cell).text
                   not in ("", "-"))  # its latest step, e.g. "starting Ray on 1 node(s)"
        shot("clusters-launching")
        click(By.CSS_SELECTOR, "tr[data-request] a")  # its own page: every step, live
        wait.until(lambda b: "checking where web can run" in
                   b.find_element(By.ID, "progress").text)
        wait.until(lambda b: "Finished: web" in b.find_element(By.ID, "outcome").text)
        assert "cluster web is UP" in browser.find_element(By.ID, "progress").text
        shot("request")
        assert launch.wait(120) == 0, launch.communicate()
        job_id = submit_ticker(daemon, "web")

        # The clusters page: the cluster is there, UP.
        click(By.LINK_TEXT, "Clusters")
        wait.until(lambda b: "UP" in b.find_element(By.CSS_SELECTOR,
                                                     'tr[data-cluster="web"]').text)
        wait.until(lambda b: "local" in b.find_element(By.CSS_SELECTOR,
                                                        'tr[data-cluster="web"]').text)
        shot("clusters")

        # The cluster: its node, its running job, its events.
        click(By.CSS_SELECTOR, 'tr[data-cluster="web"] a')
        wait.until(lambda b: b.find_element(By.CSS_SELECTOR, f'tr[data-job="{job_id}"]'))
        wait.until(lambda b: "head" in b.find_element(By.ID, "nodes").text)
        wait.until(lambda b: "INIT → UP" in b.find_element(By.ID, "events").text)
        wait.until(lambda b: "RUNNING" in b.find_element(
            By.CSS_SELECTOR, f'tr[data-job="{job_id}"]').text)
        shot("cluster")

        # Autostop, set and cancelled from the page (each confirmed): the summary follows.
        minutes = browser.find_element(By.NAME, "idle_minutes")
        minutes.clear()
        minutes.send_keys("45")
        click(By.XPATH, '//button[text()="Set autostop"]')
        wait.until(lambda b: "after 45 idle minutes?" in b.find_element(By.ID, "confirm").text)
        click(By.ID, "confirm-yes")
        wait.until(lambda b: "stop after 45m idle" in b.find_element(By.ID, "summary").text)
        assert daemon.cluster("web")["autostop_minutes"] == 45  # type: ignore[index]
        wait.until(lambda b: re.search(r"in (44|45)m", b.find_element(By.ID, "summary").text))
        shot("cluster-autostop")
        click(By.XPATH, '//button[text()="Cancel autostop"]')
        click(By.ID, "confirm-yes")
        wait.until(lambda b: "after 45m" not in b.find_element(By.ID, "summary").text)
        assert daemon.cluster("web")["autostop_minutes"] is None  # type: ignore[index]

        # An action the daemon refuses: its message and hint, on the page.
        browser.execute_script(
            "document.getElementById('summary').insertAdjacentHTML('beforeend',"
            "'<div data-cluster=\"ghost\"><button id=\"ghost\" data-do=\"stop\">"
            "Stop</button></div>')")
        click(By.ID, "ghost")
        click(By.ID, "confirm-yes")
        notice = wait.until(lambda b: b.find_element(By.CSS_SELECTOR, ".notice.error"))
        assert "cluster ghost does not exist [CLUSTER_NOT_FOUND]" in notice.text
        assert "hint: see `clusterctl status`" in notice.text
        shot("cluster-error")

        # The job: its log grows while we watch (no reload), in colour.
        click(By.CSS_SELECTOR, f'tr[data-job="{job_id}"] a')
        log = wait.until(lambda b: b.find_element(By.ID, "log"))  # never replaced

        def lines() -> int:
            return len([line for line in log.text.splitlines() if line.startswith("tick")])

        wait.until(lambda _: lines() >= 3)
        seen = lines()
        page = browser.execute_script("return performance.timeOrigin")
        wait.until(lambda _: lines() >= seen + 5)
        assert browser.execute_script("return performance.timeOrigin") == page  # no reload
        green = log.find_elements(By.CSS_SELECTOR, "span.f2")
        assert green and green[0].text == "tick"
        assert "\x1b" not in log.text and "[32m" not in log.text
        shot("job")

        # Cancel it from the page: confirm, then see CANCELLED.
        click(By.ID, "cancel-job")
        dialog = wait.until(lambda b: b.find_element(By.ID, "confirm"))
        assert dialog.is_displayed()
        assert f"Cancel job {job_id} on web?" in dialog.text
        click(By.ID, "confirm-yes")
        wait.until(lambda b: b.find_element(By.ID, "job-state").get_attribute("data-status")
                   == "CANCELLED")
        assert job_status(daemon, "web", job_id) == "CANCELLED"
        shot("job-cancelled")

        # Every cluster's events, live.
        click(By.LINK_TEXT, "Events")
        wait.until(lambda b: "launched by request" in b.find_element(By.ID, "events").text)
        shot("events")

        # Tear the cluster down from the clusters page; it leaves the list.
        click(By.LINK_TEXT, "Clusters")
        click(By.XPATH, '//tr[@data-cluster="web"]//button[text()="Tear down"]')
        wait.until(lambda b: b.find_element(By.ID, "confirm").is_displayed())
        shot("confirm-down")
        click(By.ID, "confirm-yes")
        wait.until(lambda b: not b.find_elements(By.CSS_SELECTOR, 'tr[data-cluster="web"]'))
        assert "No clusters" in browser.find_element(By.ID, "clusters").text
        wait.until(lambda b: "torn down" in b.find_element(By.ID, "notices").text)
        shot("clusters-after-down")
        assert daemon.cluster("web") is None

        errors = [entry for entry in browser.get_log("browser") if entry["level"] == "SEVERE"
                  and "/api/clusters/ghost/" not in entry["message"]]  # the refusal above
        assert not errors, errors  # CSP violations and script errors land here
    for name in ("clusters-launching", "request", "clusters", "cluster", "cluster-autostop",
                 "cluster-error", "job", "job-cancelled", "events", "clusters-after-down"):
        assert (shots / f"{name}.png").stat().st_size > 1000, name


# -- what it refuses ---------------------------------------------------------------------------


@pytest.fixture
def ticking(shared_daemon: Daemon, local_cluster: str) -> Any:
    job_id = submit_ticker(shared_daemon, local_cluster)
    yield local_cluster, job_id
    shared_daemon.ctl("cancel", local_cluster, str(job_id))


def test_refused_without_token_foreign_host_or_foreign_origin(
        shared_daemon: Daemon, ticking: tuple[str, int]) -> None:
    cluster, job_id = ticking
    with running_dashboard(shared_daemon) as dashboard:
        port = dashboard.port
        # No code, a wrong one, the token in the URL, no cookie: 403 for pages, assets, live
        # streams and actions.
        for path in ("/", f"/clusters/{cluster}", "/static/dashboard.js", "/live/clusters",
                     "/events", f"/?code={'x' * len(dashboard.code)}",
                     f"/?token={dashboard.token}"):
            assert dashboard.http("GET", path)[0] == 403, path
        cancel = f"/api/clusters/{cluster}/jobs/{job_id}/cancel"
        origin = {"Origin": dashboard.base}
        assert dashboard.http("POST", cancel, origin, "{}")[0] == 403  # no cookie

        status, headers, _ = dashboard.http("GET", f"/?code={dashboard.code}")
        assert status == 302 and headers["location"] == "/"
        cookie = headers["set-cookie"]
        assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
        jar = {"Cookie": cookie.split(";", 1)[0]}
        assert dashboard.http("GET", "/", jar)[0] == 200
        assert dashboard.http("GET", f"/?code={dashboard.code}")[0] == 403  # used

        # DNS rebinding: another host name, or another port, even with the cookie, a code
        # or the token.
        code = dashboard.new_code()
        for host in (f"evil.example:{port}", f"127.0.0.1:{port + 1}", "127.0.0.1",
                     f"[::1]:{port}"):
            assert dashboard.http("GET", "/", {**jar, "Host": host})[0] == 403, host
            assert dashboard.http("GET", "/", {**dashboard.bearer(), "Host": host})[0] == 403
            status, headers, _ = dashboard.http("GET", f"/?code={code}", {"Host": host})
            assert status == 403 and "set-cookie" not in headers, host
        assert dashboard.http("GET", f"/?code={code}")[0] == 302  # refused, not used up

        # Mutating requests from another origin (or none), and WebSocket upgrades: refused,
        # and nothing happens.
        for bad in ({}, {"Origin": "http://evil.example"}, {"Origin": "null"},
                    {"Origin": f"http://127.0.0.1:{port + 1}"}):
            status, _, text = dashboard.http("POST", cancel, {**jar, **bad}, "{}")
            assert status == 403 and "origin" in text, (bad, text)
            status, _, _ = dashboard.http("POST", f"/api/clusters/{cluster}/down",
                                          {**jar, **bad}, "{}")
            assert status == 403
        status, _, _ = dashboard.http("GET", "/live/clusters", {
            **jar, "Upgrade": "websocket", "Connection": "Upgrade",
            "Origin": "http://evil.example"})
        assert status == 403
        assert job_status(shared_daemon, cluster, job_id) == "RUNNING"
        assert shared_daemon.cluster(cluster)["status"] == "UP"  # type: ignore[index]

        # The same request from its own page works: the refusals above were the guard's.
        status, headers, text = dashboard.http("POST", cancel, {**jar, **origin}, "{}")
        assert status == 200 and json.loads(text)["ok"], text
        assert "default-src 'none'" in headers["content-security-policy"]
        wait_for(lambda: job_status(shared_daemon, cluster, job_id) == "CANCELLED", 30,
                 "the job to be cancelled")

        # An error shows the daemon's message and hint.
        status, _, text = dashboard.http("POST", "/api/clusters/ghost/stop",
                                         {**jar, **origin}, "{}")
        error = json.loads(text)["error"]
        assert status == 400 and error["code"] == "CLUSTER_NOT_FOUND"
        assert "ghost" in error["message"] and "clusterctl" in error["hint"]


def test_one_dashboard_per_daemon(shared_daemon: Daemon) -> None:
    state_file = shared_daemon.socket.parent / "dashboard.json"
    first = start_dashboard(shared_daemon)
    try:
        assert stat.S_IMODE(state_file.stat().st_mode) == 0o600
        assert stat.S_IMODE(state_file.parent.stat().st_mode) == 0o700
        state = json.loads(state_file.read_text())
        assert state["pid"] == first.process.pid and state["port"] == first.port
        second = shared_daemon.ctl("dashboard", "--no-browser", timeout=60)
        assert second.returncode == 0, second.stderr
        assert f"already running (pid {first.process.pid})" in second.stdout
        # A link of its own (the running one's, asked for with the token), good once.
        match = URL.search(second.stdout)
        assert match and int(match.group(1)) == first.port, second.stdout
        assert match.group(2) != first.code
        assert first.http("GET", f"/?code={match.group(2)}")[0] == 302
        assert first.http("GET", f"/?code={match.group(2)}")[0] == 403
    finally:
        assert stop_dashboard(first) == 0  # Ctrl-C stops it cleanly
    assert not state_file.exists()
    assert not pid_alive(first.process.pid)

    # A state file left by a dashboard that died (its pid gone) does not stop a new one.
    state_file.write_text(json.dumps({"pid": 2**22 + 7, "token": "x", "port": 1}))
    os.chmod(state_file, 0o600)
    third = start_dashboard(shared_daemon)
    try:
        assert third.port != 1
        assert json.loads(state_file.read_text())["pid"] == third.process.pid
        assert third.http("GET", "/", {"Cookie": third.cookie()})[0] == 200
    finally:
        stop_dashboard(third)


def answering_pid(daemon: Daemon) -> int | None:
    """The pid of whichever clusterd answers on the daemon's socket now, if any."""
    try:
        with Client(str(daemon.socket), autostart=False) as client:
            return int(client.call(PingArgs())["pid"])
    except DaemonUnavailable:
        return None


def test_a_daemon_that_went_away_is_started_again(daemon: Daemon) -> None:
    """As for clusterctl's commands: the next call starts clusterd (unless autostart is off)."""
    env = {k: v for k, v in daemon.env.items() if k != "CLUSTERD_NO_AUTOSTART"}
    old_pid = daemon.process.pid if daemon.process else None
    board = start_dashboard(daemon, env=env)
    try:
        cookie = board.cookie()
        assert daemon.stop() == 0
        status, _, body = board.http("GET", "/", {"Cookie": cookie})
        assert status == 200 and "<h1>Clusters</h1>" in body, body[:2000]
        assert answering_pid(daemon) not in (None, old_pid)
    finally:
        stop_dashboard(board)
        # Whatever the outcome, no daemon the dashboard started is left behind: found by its
        # environment, since one still starting does not answer yet.
        for restarted in daemons_of(Path(daemon.env["XDG_RUNTIME_DIR"])):
            if restarted != old_pid:
                os.kill(restarted, signal.SIGTERM)
                wait_for(lambda pid=restarted: not pid_alive(pid), 30,
                         "the restarted clusterd to stop")


def test_port_option_and_a_taken_port(shared_daemon: Daemon) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        refused = shared_daemon.ctl("dashboard", "--no-browser", "--port", str(port),
                                    timeout=60)
        assert refused.returncode == 1
        assert f"cannot listen on 127.0.0.1:{port}" in refused.stderr
        assert "--port" in refused.stderr
    chosen = start_dashboard(shared_daemon, "--port", str(port))
    try:
        assert chosen.port == port and chosen.url.startswith(f"http://127.0.0.1:{port}/")
    finally:
        stop_dashboard(chosen)


def test_another_local_user_is_refused_even_with_a_good_link(shared_daemon: Daemon) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to act as another user")
    python = shutil.which("python3", path="/usr/bin:/bin")
    if python is None:
        pytest.skip("no system python3 that another user can run")
    code = ("import http.client, sys\n"
            "c = http.client.HTTPConnection('127.0.0.1', int(sys.argv[1]), timeout=30)\n"
            "c.request('GET', '/?code=' + sys.argv[2])\n"
            "r = c.getresponse()\n"
            "print(r.status, r.read().decode().strip())\n")
    with running_dashboard(shared_daemon) as dashboard:
        args = [python, "-c", code, str(dashboard.port), dashboard.code]
        intruder = subprocess.run(args, user=65534, capture_output=True, text=True, timeout=60)
        assert intruder.stdout.startswith("403"), intruder.stdout + intruder.stderr
        assert "belongs to another user" in intruder.stdout
        mine = subprocess.run(args, capture_output=True, text=True, timeout=60)
        assert mine.stdout.startswith("302"), mine.stdout + mine.stderr


def test_the_token_is_on_no_command_line(shared_daemon: Daemon, tmp_path: Path) -> None:
    """The browser's command line (any user reads it in /proc) and what is printed carry a
    link good once, for seconds: never the dashboard's token."""
    opened = tmp_path / "opened"
    browser = tmp_path / "browser"
    browser.write_text(f'#!/bin/sh\nprintf "%s\\n" "$0" "$@" >> {opened}\n')
    browser.chmod(0o700)
    env = {**shared_daemon.env, "BROWSER": str(browser)}
    first = start_dashboard(shared_daemon, env=env, browser=True)
    try:
        wait_for(lambda: opened.exists() and len(opened.read_text().split()) == 2, 30,
                 "the dashboard to open its link")
        assert "token=" not in opened.read_text()
        token = first.token
        argv = opened.read_text().split()
        assert argv == [str(browser), first.url]
        second = shared_daemon.ctl("dashboard", env={"BROWSER": str(browser)}, timeout=60)
        assert second.returncode == 0, second.stderr
        argv = opened.read_text().split()
        assert len(argv) == 4 and argv[3] != first.url and argv[3] in second.stdout
        for shown in (opened.read_text(), second.stdout, second.stderr):
            assert "token=" not in shown and token not in shown
        # Each opened link lets in once.
        for url in (argv[1], argv[3]):
            path = url.removeprefix(first.base)
            assert first.http("GET", path)[0] == 302, url
            assert first.http("GET", path)[0] == 403, url
    finally:
        stop_dashboard(first)
    out, err = first.process.communicate(timeout=10)
    assert token not in out + err
