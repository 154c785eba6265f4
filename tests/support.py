"""Helpers for the integration and end-to-end tests: real daemons, real Ray, real processes,
each in directories of its own, each stopped by its pid afterwards."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple, NoReturn

VENV_BIN = Path(sys.executable).parent
CLUSTERCTL = str(VENV_BIN / "clusterctl")
# Prefix for a command a test will Ctrl-C (SIGINT): a shell runs background jobs with SIGINT
# ignored, the ignoring is inherited through exec, and Python then installs no
# KeyboardInterrupt handler, so the suite started in the background (`scripts/test &`) saw
# clusterctl shrug off every Ctrl-C. GNU env resets it to the default before the exec.
CTRL_C_ABLE = ("env", "--default-signal=INT")


def short_tempdir(prefix: str) -> Path:
    # Unix socket paths are limited to 107 bytes: keep test dirs near the root.
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))


def wait_for(predicate: Any, timeout: float, what: str, interval: float = 0.05) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")
        time.sleep(interval)


def missing(reason: str) -> NoReturn:
    """Skip a test that cannot run here; but under CI=true, where scripts/test installs all
    the suite needs, fail it: a missing tool there is a broken set-up, not a reason to pass."""
    import pytest

    if os.environ.get("CI") == "true":
        pytest.fail(f"{reason} (CI=true: scripts/test installs it)", pytrace=False)
    pytest.skip(reason)


def needs_tool(tool: str, package: str) -> str:
    """The path of `tool`, which Debian's `package` has (scripts/test installs it); see
    `missing` for a machine without it."""
    found = shutil.which(tool)
    if found is None:
        missing(f"{tool} is not installed (Debian package {package})")
    return found


class AutostopPass(NamedTuple):
    began: float  # time.time() when the pass began
    checked: list[str]  # the clusters it checked


def autostop_pass_after(daemon: Daemon, moment: float) -> AutostopPass | None:
    """The first pass of the daemon's autostop loop that began after `moment` (a
    time.time()), None before there was one. Once there was, every decision that pass made
    (an autostop fired: an event "autostop due ...") is among the cluster's events: a test
    that must see no autostop waits for this instead of sleeping."""
    for line in daemon.log().splitlines():
        if '"autostop pass"' not in line:
            continue
        entry = json.loads(line)
        if entry.get("event") == "autostop pass" and entry["began"] > moment:
            return AutostopPass(entry["began"], list(entry["checked"]))
    return None


def autostops_fired(events: list[dict[str, Any]]) -> list[str]:
    """The reasons of the autostops the daemon fired, among a cluster's events (setting or
    cancelling autostop is an event of that kind too)."""
    return [e["reason"] for e in events
            if e["kind"] == "autostop" and e["reason"].startswith("autostop due")]


def read_until(process: subprocess.Popen[str], needle: str, timeout: float) -> str:
    """Read the process's stderr until a line contains `needle`; return that line."""
    assert process.stderr is not None
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if needle in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no line with {needle!r} within {timeout} s")


def connectable(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        try:
            sock.connect(str(path))
        except OSError:
            return False
    return True


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@dataclasses.dataclass
class Daemon:
    root: Path
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None
    # Run the daemon and clusterctl through this (e.g. `ip netns exec NS`: the EC2 test bed).
    wrap: list[str] = dataclasses.field(default_factory=list)

    @property
    def socket(self) -> Path:
        return Path(self.env["XDG_RUNTIME_DIR"]) / "clusterd" / "clusterd.sock"

    @property
    def state_dir(self) -> Path:
        return Path(self.env["XDG_STATE_HOME"]) / "clusterd"

    @property
    def log_path(self) -> Path:
        return self.state_dir / "daemon-test.log"

    def start(self, extra_env: dict[str, str] | None = None,
              open_files: int | None = None) -> Daemon:
        """Start clusterd; `open_files` lowers its RLIMIT_NOFILE (soft and hard)."""
        self.state_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        # As clusterctl's autostart makes it: private to the user.
        log = os.fdopen(os.open(self.log_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600),
                        "ab")
        def limit() -> None:
            if open_files is not None:
                import resource

                resource.setrlimit(resource.RLIMIT_NOFILE, (open_files, open_files))

        self.process = subprocess.Popen(
            [*self.wrap, sys.executable, "-m", "clusterd"],
            env={**self.env, **(extra_env or {})},
            stdout=log,
            stderr=log,
            start_new_session=True,
            preexec_fn=limit if open_files is not None else None,
        )
        log.close()
        wait_for(lambda: connectable(self.socket) or self.process.poll() is not None, 30,
                 "clusterd to listen")
        assert self.process.poll() is None, f"clusterd died:\n{self.log()}"
        return self

    def stop(self, timeout: float = 15) -> int:
        assert self.process is not None
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise AssertionError(f"clusterd ignored SIGTERM for {timeout} s") from None

    def kill(self) -> None:
        assert self.process is not None
        self.process.kill()
        self.process.wait()

    def wait_killed_at_fault_point(self, timeout: float = 60) -> None:
        """The daemon, started with CLUSTERD_TEST_FAULTS, reached its armed point and was
        killed there (SIGKILL, as clusterd/faults.py does it), saying so in its log."""
        process = self.process
        assert process is not None
        wait_for(lambda: process.poll() is not None, timeout,
                 "the daemon to die at its fault point")
        assert process.returncode == -9, process.returncode
        assert "fault point reached" in self.log()

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def ctl(self, *args: str, timeout: float = 180, input: str | None = None,
            env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [*self.wrap, CLUSTERCTL, *args], env={**self.env, **(env or {})},
            capture_output=True, text=True, timeout=timeout, input=input, cwd=self.root,
        )

    def popen_ctl(self, *args: str) -> subprocess.Popen[str]:
        return subprocess.Popen(
            [*CTRL_C_ABLE, CLUSTERCTL, *args], env=self.env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True, cwd=self.root, start_new_session=True,
        )

    def status(self) -> list[dict[str, Any]]:
        result = self.ctl("status", "--json")
        assert result.returncode == 0, result.stderr
        clusters: list[dict[str, Any]] = json.loads(result.stdout)
        return clusters

    def cluster(self, name: str) -> dict[str, Any] | None:
        return next((c for c in self.status() if c["name"] == name), None)

    def down_all(self) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        for cluster in self.status():
            self.ctl("down", "-y", "--purge", cluster["name"])


def make_env(root: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CLUSTERD_", "XDG_"))}
    runtime = root / "rt"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env.update(
        XDG_RUNTIME_DIR=str(runtime),
        XDG_STATE_HOME=str(root / "state"),
        XDG_CONFIG_HOME=str(root / "config"),
        CLUSTERD_NO_AUTOSTART="1",
        CLUSTERD_LOG_LEVEL="debug",
        CLUSTERD_LOCAL_OBJECT_STORE_BYTES=str(80 * 1024 * 1024),
        PATH=f"{VENV_BIN}:{env.get('PATH', '/usr/bin:/bin')}",
    )
    return env


@contextlib.contextmanager
def running_daemon(prefix: str = "cd-") -> Iterator[Daemon]:
    root = short_tempdir(prefix)
    daemon = Daemon(root, make_env(root)).start()
    try:
        yield daemon
    finally:
        try:
            daemon.down_all()
        finally:
            daemon.stop()
            shutil.rmtree(root, ignore_errors=True)


def ray_processes_of(runtime_dir: Path) -> list[int]:
    """Pids recorded by the node helper for a cluster's runtime that are still alive."""
    alive = []
    for name in ("ray.pid", "agent.pid"):
        path = runtime_dir / "run" / name
        if path.exists():
            pid = json.loads(path.read_text())["pid"]
            if pid_alive(pid):
                alive.append(pid)
    return alive


def pids_with(marker: str) -> list[int]:
    """Pids on this machine whose command line contains marker."""
    found = []
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                cmdline = Path(f"/proc/{name}/cmdline").read_bytes().replace(b"\0", b" ")
            except OSError:
                continue
            if marker.encode() in cmdline:
                found.append(int(name))
    return found


def daemons_of(runtime_dir: Path) -> list[int]:
    """Pids of every clusterd whose XDG_RUNTIME_DIR is `runtime_dir`, read from /proc: one an
    autostart spawned that does not answer yet is found too."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if b"clusterd" in argv and f"XDG_RUNTIME_DIR={runtime_dir}".encode() in environ:
            found.append(int(entry.name))
    return found


@contextlib.contextmanager
def running(daemon: Daemon) -> Iterator[Daemon]:
    """A daemon (of a test bed), started, and at the end with every cluster torn down."""
    try:
        daemon.start()
        yield daemon
    finally:
        try:
            daemon.down_all()
            daemon.stop()
        finally:
            shutil.rmtree(daemon.root, ignore_errors=True)


def managed_job(daemon: Daemon, name: str) -> dict[str, Any]:
    """The newest managed job named `name`, as `jobs queue --all --json` shows it."""
    jobs = json.loads(daemon.ctl("jobs", "queue", "--all", "--json").stdout)
    found: dict[str, Any] = next(j for j in jobs if j["name"] == name)
    return found


def managed_job_log(daemon: Daemon, name: str) -> str:
    """The whole log of the newest managed job named `name`, every attempt."""
    job_id = str(managed_job(daemon, name)["job_id"])
    return daemon.ctl("jobs", "logs", job_id, "--no-follow").stdout


def cloud_name(daemon: Daemon, cluster: str) -> str:
    found = daemon.cluster(cluster)
    assert found is not None, f"no cluster {cluster}"
    return str(found["cloud_name"])


def make_git_repo(path: Path, first: str, second: str, name: str = "f.txt") -> Path:
    """A repository whose file `name` reads `first` at tag v1 and `second` at HEAD."""
    subprocess.run(["git", "init", "-q", "-b", "main", str(path)], check=True)
    git = ["git", "-C", str(path), "-c", "user.email=t@t", "-c", "user.name=t"]
    (path / name).write_text(first)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-q", "-m", "1"], check=True)
    subprocess.run([*git, "tag", "v1"], check=True)
    (path / name).write_text(second)
    subprocess.run([*git, "commit", "-q", "-am", "2"], check=True)
    return path


@dataclasses.dataclass(frozen=True)
class OtherUser:
    """A second Linux user: the attacker of the security tests."""

    name: str
    uid: int
    gid: int
    home: Path

    def run(self, argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
        """Run argv as this user (setpriv: no login, no PAM, no inherited groups)."""
        return subprocess.run(
            ["setpriv", f"--reuid={self.uid}", f"--regid={self.gid}", "--init-groups", *argv],
            capture_output=True, text=True, timeout=kwargs.pop("timeout", 60),
            env={"PATH": "/usr/bin:/bin", "HOME": str(self.home), "LANG": "C.UTF-8"},
            cwd="/", **kwargs,
        )

    def pids(self) -> list[int]:
        out = subprocess.run(["ps", "-o", "pid=", "-u", self.name], capture_output=True,
                             text=True).stdout
        return [int(word) for word in out.split()]


@contextlib.contextmanager
def other_user(prefix: str = "cdx") -> Iterator[OtherUser]:
    """A fresh Linux user with a unique name (needs root); its processes are stopped by pid
    and the user and its home are deleted afterwards."""
    import pwd
    import secrets

    if os.getuid() != 0 or shutil.which("useradd") is None:
        import pytest

        pytest.skip("needs root and useradd to make a second user")
    name = f"{prefix}{secrets.token_hex(3)}"
    subprocess.run(["useradd", "-m", "-s", "/bin/bash", "-c", "clusterd test attacker", name],
                   check=True, capture_output=True, timeout=60)
    entry = pwd.getpwnam(name)
    user = OtherUser(name, entry.pw_uid, entry.pw_gid, Path(entry.pw_dir))
    try:
        yield user
    finally:
        for pid in user.pids():
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        subprocess.run(["userdel", "-r", name], capture_output=True, timeout=60)


CONTAINERS_CONF = """[containers]
default_ulimits = []
netns = "host"
[engine]
cgroup_manager = "cgroupfs"
events_logger = "file"
runtime = "runc"
"""


@contextlib.contextmanager
def busybox_image(name: str, tools: tuple[str, ...] = ("sh", "cat", "echo", "ls", "id", "env"),
                  files: dict[str, str] | None = None,
                  changes: tuple[str, ...] = ()) -> Iterator[dict[str, str]]:
    """A container runtime that works here (podman with runc, no cgroup management) and a
    small image `name` of its own: busybox as `tools`, plus `files` (path in the image: text),
    with Dockerfile `changes` (e.g. "USER 65534"). Yields the environment podman needs
    (CONTAINERS_CONF); the image is removed afterwards."""
    if not (shutil.which("podman") and shutil.which("runc") and Path("/bin/busybox").exists()):
        missing("needs podman, runc and busybox-static (scripts/test installs them)")
    root = short_tempdir("cdpod-")
    conf = root / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    env = {**os.environ, "CONTAINERS_CONF": str(conf)}
    rootfs = root / "rootfs"
    # Modes set, not left to the umask: an image's own user (USER 65534) must reach its
    # tools whatever umask the test process has.
    for directory in ("bin", "etc", "tmp"):
        (rootfs / directory).mkdir(parents=True)
        (rootfs / directory).chmod(0o1777 if directory == "tmp" else 0o755)
    rootfs.chmod(0o755)
    shutil.copy("/bin/busybox", rootfs / "bin" / "busybox")
    (rootfs / "bin" / "busybox").chmod(0o755)
    for tool in tools:
        (rootfs / "bin" / tool).symlink_to("busybox")
    for path, text in (files or {}).items():
        (rootfs / path.lstrip("/")).write_text(text)
        (rootfs / path.lstrip("/")).chmod(0o644)
    subprocess.run(["tar", "-C", str(rootfs), "-cf", str(root / "rootfs.tar"), "."], check=True)
    subprocess.run(["podman", "import", *(f"--change={c}" for c in changes),
                    str(root / "rootfs.tar"), name], env=env, check=True,
                   capture_output=True, timeout=120)
    try:
        yield {"CONTAINERS_CONF": str(conf)}
    finally:
        subprocess.run(["podman", "rmi", "-f", name], env=env, capture_output=True,
                       timeout=120)
        shutil.rmtree(root, ignore_errors=True)
