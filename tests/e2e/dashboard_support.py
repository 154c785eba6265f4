"""A real `clusterctl dashboard` process and a real headless Chromium for the dashboard tests."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import re
import select
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tests.support import CLUSTERCTL, CTRL_C_ABLE, Daemon, missing

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
URL = re.compile(r"http://127\.0\.0\.1:(\d+)/\?code=([A-Za-z0-9_-]+)")


@dataclass
class Dashboard:
    process: subprocess.Popen[str]
    url: str  # the link it printed: good once, for seconds
    port: int
    code: str  # the one-time code of that link
    state_file: Path

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def token(self) -> str:
        """The long-lived token, where a script finds it: the state file, readable only by
        this user."""
        return str(json.loads(self.state_file.read_text())["token"])

    def bearer(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    def new_code(self) -> str:
        """A fresh one-time code, asked for with the token, as a second `clusterctl
        dashboard` asks."""
        status, _, text = self.http("POST", "/api/login-code", self.bearer(), "{}")
        assert status == 200, text
        match = URL.fullmatch(json.loads(text)["url"])
        assert match, text
        return match.group(2)

    def http(self, method: str, path: str, headers: dict[str, str] | None = None,
             body: str | None = None) -> tuple[int, dict[str, str], str]:
        """One request, as is (no redirects followed, no cookies kept): status, headers,
        body. The Host header is ours unless `headers` names one."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=30)
        try:
            connection.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
            sent = {"Host": f"127.0.0.1:{self.port}", **(headers or {})}
            if body is not None:
                sent.setdefault("Content-Type", "application/json")
                sent["Content-Length"] = str(len(body.encode()))
            for name, value in sent.items():
                connection.putheader(name, value)
            connection.endheaders(body.encode() if body is not None else None)
            response = connection.getresponse()
            text = response.read(64 * 1024).decode(errors="replace")
            return response.status, {k.lower(): v for k, v in response.getheaders()}, text
        finally:
            connection.close()

    def live(self, path: str, headers: dict[str, str],
             until: Callable[[str, Any], bool], timeout: float) -> list[tuple[str, Any, str]]:
        """Read a page's live stream (server-sent events) as a browser would: its events
        (name, data, id) until `until(name, data)` holds, or the stream ends."""
        connection = http.client.HTTPConnection("127.0.0.1", self.port, timeout=timeout)
        deadline = time.monotonic() + timeout
        seen: list[tuple[str, Any, str]] = []
        try:
            connection.request("GET", path, headers={"Host": f"127.0.0.1:{self.port}",
                                                     **headers})
            response = connection.getresponse()
            assert response.status == 200, response.status
            assert response.getheader("Content-Type", "").startswith("text/event-stream")
            name, data, event_id = "", "", ""
            while time.monotonic() < deadline:
                assert connection.sock is not None
                connection.sock.settimeout(max(0.1, deadline - time.monotonic()))
                line = response.readline().decode()
                if not line:
                    return seen  # the dashboard ended the stream
                line = line.rstrip("\n")
                if line.startswith("event: "):
                    name = line[len("event: "):]
                elif line.startswith("data: "):
                    data = line[len("data: "):]
                elif line.startswith("id: "):
                    event_id = line[len("id: "):]
                elif not line and name:
                    seen.append((name, json.loads(data), event_id))
                    if until(name, seen[-1][1]):
                        return seen
                    name, data, event_id = "", "", ""
        except TimeoutError:
            pass
        finally:
            connection.close()
        raise AssertionError(f"{path}: not seen in {timeout:g} s; saw {seen[-20:]}")

    def cookie(self) -> str:
        """Trade a fresh code for the session cookie, as a browser's first visit does."""
        status, headers, _ = self.http("GET", f"/?code={self.new_code()}")
        assert status == 302, status
        return headers["set-cookie"].split(";", 1)[0]


def start_dashboard(daemon: Daemon, *extra: str, env: dict[str, str] | None = None,
                    browser: bool = False) -> Dashboard:
    """`clusterctl dashboard`, running; with `browser`, it opens its link too ($BROWSER)."""
    process = subprocess.Popen(
        [*CTRL_C_ABLE, CLUSTERCTL, "dashboard", *([] if browser else ["--no-browser"]), *extra],
        env=env or daemon.env,
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=daemon.root,
        start_new_session=True,
    )
    assert process.stdout is not None
    lines = []
    for line in process.stdout:  # the URL comes on the second line, once it accepts
        lines.append(line)
        match = URL.search(line)
        if match:
            return Dashboard(process, match.group(0), int(match.group(1)), match.group(2),
                             daemon.socket.parent / "dashboard.json")
        if len(lines) > 5:
            break
    process.kill()
    _, err = process.communicate(timeout=10)
    raise AssertionError(f"no URL from the dashboard: {''.join(lines)}{err}")


def stop_dashboard(dashboard: Dashboard) -> int:
    """Ctrl-C, as a user stops it; its exit code."""
    if dashboard.process.poll() is None:
        dashboard.process.send_signal(signal.SIGINT)
    try:
        return dashboard.process.wait(20)
    except subprocess.TimeoutExpired:
        stacks = _stacks_of(dashboard.process)
        dashboard.process.kill()
        dashboard.process.wait()
        raise AssertionError(f"the dashboard ignored Ctrl-C for 20 s; its threads:\n{stacks}"
                             ) from None


def _stacks_of(process: subprocess.Popen[str]) -> str:
    """Every thread's stack of a running dashboard (it prints them on SIGUSR1), as it wrote
    them to stderr, up to 5 s."""
    assert process.stderr is not None
    process.send_signal(signal.SIGUSR1)
    out, deadline = "", time.monotonic() + 5
    fd = process.stderr.fileno()
    while time.monotonic() < deadline and "File " not in out.rsplit("Thread 0x", 1)[-1]:
        if select.select([fd], [], [], max(0.0, deadline - time.monotonic()))[0]:
            chunk = os.read(fd, 65536)
            if not chunk:
                break
            out += chunk.decode(errors="replace")
    # the rest of a dump written in one go is there by now, or never
    while select.select([fd], [], [], 0.5)[0]:
        chunk = os.read(fd, 65536)
        if not chunk:
            break
        out += chunk.decode(errors="replace")
    return out[-6000:]


@contextlib.contextmanager
def running_dashboard(daemon: Daemon) -> Iterator[Dashboard]:
    dashboard = start_dashboard(daemon)
    try:
        yield dashboard
    finally:
        stop_dashboard(dashboard)


def browser_missing() -> str | None:
    for path in (CHROMIUM, CHROMEDRIVER):
        if not Path(path).exists():
            return f"{path} is missing (apt-get install chromium chromium-driver)"
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    return None


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[Any]:
    """Debian's headless Chromium through its own chromedriver: an explicit Service, so
    selenium-manager never looks for (or downloads) a browser; flags that keep it off the
    network (there is none here but loopback)."""
    absent = browser_missing()
    if absent:
        missing(absent)  # scripts/test installs them: under CI=true, a failure
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-quic",
                 "--no-first-run", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage",
                 "--window-size=1300,1000", f"--user-data-dir={profile}"):
        options.add_argument(flag)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        driver.set_page_load_timeout(60)
        yield driver
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)
