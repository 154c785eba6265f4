"""One dashboard per daemon: the lock, the 0600 state file, stale state."""

from __future__ import annotations

import json
import os
import socket
import stat
import subprocess
import sys
from pathlib import Path

from clusterctl.dashboard._instance import Instance


def test_publish_read_release(tmp_path: Path) -> None:
    instance = Instance(str(tmp_path / "rt"))
    assert instance.acquire()
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen()
        port = listening.getsockname()[1]
        instance.publish(port, "t")
        path = Path(instance.state_path)
        assert stat.S_IMODE(path.stat().st_mode) == 0o600
        assert stat.S_IMODE(path.parent.stat().st_mode) == 0o700
        state = json.loads(path.read_text())
        assert state["pid"] == os.getpid() and state["token"] == "t"
        assert "url" not in state  # a link is asked for (see test_dashboard_guard.py)
        other = Instance(str(tmp_path / "rt"))
        assert not other.acquire()  # the lock is ours
        assert other.running(wait_s=0)["port"] == port  # type: ignore[index]
    assert other.running(wait_s=0) is None  # alive, but its port no longer answers
    instance.release()
    assert not path.exists()
    assert other.acquire()
    other.release()


def test_a_dead_pid_is_not_a_running_dashboard(tmp_path: Path) -> None:
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"],
                          capture_output=True, text=True, check=True)
    instance = Instance(str(tmp_path))
    Path(instance.state_path).write_text(json.dumps({"pid": int(dead.stdout), "port": 1,
                                                     "url": "x"}))
    assert instance.running(wait_s=0) is None
    assert instance.acquire()  # and a new one may start
    instance.release()
    assert Path(instance.state_path).exists()  # not ours to remove


def test_clusterctl_does_not_import_the_dashboard_for_other_verbs() -> None:
    code = ("import sys; from clusterctl.cli import parse; parse(['status']); "
            "parse(['dashboard', '--port', '5']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('aiohttp', 'jinja2', 'asyncio') or m.startswith('clusterctl.dashboard.')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"


def test_templates_and_assets_are_package_data() -> None:
    import fnmatch
    import tomllib

    root = Path(__file__).resolve().parents[2]
    patterns = tomllib.loads((root / "pyproject.toml").read_text())["tool"]["setuptools"][
        "package-data"]["clusterctl.dashboard"]
    package = root / "ctl" / "clusterctl" / "dashboard"
    files = [p.relative_to(package).as_posix() for p in package.rglob("*")
             if p.is_file() and p.suffix not in (".py", ".pyc")]
    assert files
    unshipped = [f for f in files if not any(fnmatch.fnmatch(f, p) for p in patterns)]
    assert not unshipped
