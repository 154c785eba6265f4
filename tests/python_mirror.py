"""A Python download mirror on loopback, for nodes with no usable Python: what uv's `python
install --python-downloads-json-url` reads (a list of downloads with their sha256), and the
archive it names, served over HTTP.

These machines cannot reach python-build-standalone's releases (GitHub, releases.astral.sh),
so the archive is made here in that project's `install_only` layout (`python/bin`,
`python/lib`) from the machine image's pyenv CPython of the daemon's minor: its interpreter,
its shared libpython (its RUNPATH made relative with patchelf, as python-build-standalone's
is, so it runs from wherever uv unpacks it) and its standard library without site-packages
and tests. Made once, kept outside the repository (CLUSTERD_TESTBED_CACHE, default
/var/cache/clusterd-testbed) under its version.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import http.server
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

CACHE = Path(os.environ.get("CLUSTERD_TESTBED_CACHE") or "/var/cache/clusterd-testbed")
PYENV = Path("/root/.pyenv/versions")
_LEFT_OUT = {"site-packages", "test", "idlelib", "tkinter", "turtledemo", "__pycache__"}


def _pyenv_python() -> Path:
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    found = sorted(PYENV.glob(f"{minor}.*"), key=lambda p: [int(x) for x in
                                                           p.name.split(".") if x.isdigit()])
    assert found, (f"no CPython {minor} under {PYENV} to serve as the nodes' download (the "
                   "machine image's pyenv has it)")
    return found[-1]


def standalone_archive() -> tuple[Path, str]:
    """The archive (made the first time) and its CPython version X.Y.Z."""
    source = _pyenv_python()
    version = source.name
    minor = version.rsplit(".", 1)[0]
    target = CACHE / "python" / f"cpython-{version}-x86_64-unknown-linux-gnu-install_only.tar.gz"
    if target.exists():
        return target, version
    assert shutil.which("patchelf"), "scripts/test installs Debian's patchelf"
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent) as scratch:
        root = Path(scratch) / "python"
        (root / "bin").mkdir(parents=True)
        (root / "lib").mkdir()
        shutil.copy2(source / "bin" / f"python{minor}", root / "bin" / f"python{minor}")
        for name in ("python3", "python"):
            (root / "bin" / name).symlink_to(f"python{minor}")
        for library in (source / "lib").glob(f"libpython{minor}*.so*"):
            if not library.is_symlink():
                shutil.copy2(library, root / "lib" / library.name)
        subprocess.run(["patchelf", "--set-rpath", "$ORIGIN/../lib",
                        str(root / "bin" / f"python{minor}")], check=True, timeout=60)
        shutil.copytree(source / "lib" / f"python{minor}", root / "lib" / f"python{minor}",
                        ignore=lambda _dir, names: [n for n in names if n in _LEFT_OUT])
        partial = Path(scratch) / target.name  # a worker building it too has its own
        with tarfile.open(partial, "w:gz", compresslevel=1) as archive:
            archive.add(root, arcname="python")
        partial.rename(target)
    return target, version


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            digest.update(block)
    return digest.hexdigest()


def downloads_json(archive: Path, version: str, url: str) -> dict[str, object]:
    """uv's download list, naming `archive` (at `url`) with its digest."""
    major, minor, patch = (int(x) for x in version.split("."))
    return {f"cpython-{version}-linux-x86_64-gnu": {
        "name": "cpython", "arch": {"family": "x86_64", "variant": None}, "os": "linux",
        "libc": "gnu", "major": major, "minor": minor, "patch": patch, "prerelease": "",
        "url": url, "sha256": _sha256(archive), "variant": None, "build": "clusterd-test"}}


def _publish(served: Path, base: str, made: tuple[Path, str] | None = None) -> str:
    """The archive (`made`: (path, version); default: standalone_archive) and its download
    list, naming it under `base`, in served; the list's URL."""
    archive, version = made or standalone_archive()
    os.link(archive, served / archive.name) if archive.stat().st_dev == served.stat(
    ).st_dev else shutil.copy2(archive, served / archive.name)
    (served / "downloads.json").write_text(json.dumps(
        downloads_json(archive, version, f"{base}/{archive.name}")))
    return f"{base}/downloads.json"


@contextlib.contextmanager
def serving() -> Iterator[str]:
    """Serve the archive and its download list on loopback; yields the list's URL."""
    with tempfile.TemporaryDirectory(prefix="cd-pymirror-") as scratch:
        served = Path(scratch)
        handler = functools.partial(_QuietHandler, directory=str(served))
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        url = _publish(served, f"http://127.0.0.1:{server.server_address[1]}")
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield url
        finally:
            server.shutdown()
            server.server_close()
            thread.join(timeout=10)


@contextlib.contextmanager
def serving_in(netns: str, host: str, port: int, made: tuple[Path, str]) -> Iterator[str]:
    """Serve the archive `made` ((path, version)) and its download list from inside network
    namespace netns on host:port (a test bed's service address, which its nodes reach as a
    real cloud's reach the Internet); yields the list's URL once it answers there."""
    with tempfile.TemporaryDirectory(prefix="cd-pymirror-") as scratch:
        served = Path(scratch)
        os.chmod(served, 0o755)
        url = _publish(served, f"http://{host}:{port}", made)
        server = subprocess.Popen(
            ["ip", "netns", "exec", netns, sys.executable, "-m", "http.server", str(port),
             "--bind", host, "--directory", str(served)],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            check = ("import urllib.request as u, sys; "
                     f"sys.exit(u.urlopen({url!r}, timeout=5).status != 200)")
            deadline = time.monotonic() + 30
            while subprocess.run(["ip", "netns", "exec", netns, sys.executable, "-c", check],
                                 capture_output=True, timeout=30).returncode != 0:
                assert server.poll() is None, f"the mirror in {netns} exited ({server.returncode})"
                assert time.monotonic() < deadline, f"the mirror in {netns} never answered {url}"
                time.sleep(0.2)
            yield url
        finally:
            server.terminate()
            server.wait(timeout=30)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:
        pass
