"""The runtime's bytecode, compiled once per wheelhouse on this machine so that no node has to.

uv installs the wheels without compiling them (pip compiled all of Ray's 2,600 modules ahead of
time: most of its 15 s). But a fresh node's first Ray start imports about a thousand of them in
each of several processes (Ray's command line, the dashboard agent, the runtime-env agent, the
log monitor, the agent), each writing the same .pyc files; on the EC2 test bed the runtime of
a fresh install took 8.3-8.6 s to start, one with bytecode in place 4.2-4.3 s. So the wheelhouse
carries an archive of the runtime wheels' bytecode, compiled here from the very sources the
wheels hold, which goes into the venv each node gets.

The .pyc files are checked-hash ones (PEP 552): valid wherever the same source is, whatever its
path or its mtime on the node, and checked against that source at every import, so a .pyc
never runs in place of a source that differs (Python compiles the source then, as without the
archive). The bytecode format is fixed within a Python minor version, which the wheelhouse key
names: only a node with the daemon's Python gets it, inside the runtime's archive (built
from these wheels and this bytecode: venv_archive.py).
"""

from __future__ import annotations

import subprocess
import sys
import tarfile
import tempfile
import zipfile
from pathlib import Path, PurePosixPath

from clusterctl.protocol import ErrorCode, ProtocolError

ARCHIVE = f"bytecode-{sys.implementation.cache_tag}.tar.gz"
COMPILE_TIMEOUT_S = 900


def _sources(wheel: Path, into: Path) -> int:
    """The importable .py files of `wheel`, extracted under `into` as they lie in
    site-packages (a wheel's root is site-packages; its .data and .dist-info hold no modules
    Python imports from there). Returns how many."""
    count = 0
    with zipfile.ZipFile(wheel) as archive:
        for member in archive.infolist():
            path = PurePosixPath(member.filename)
            if path.suffix != ".py" or path.parts[0].endswith((".data", ".dist-info")):
                continue
            archive.extract(member, into)  # zipfile drops absolute parts and `..`
            count += 1
    return count


def build_archive(wheels: list[Path], target: Path) -> None:
    """Compile the modules of `wheels` and write their .pyc files to `target` (tar.gz,
    paths relative to site-packages). Blocking, and CPU-heavy (a few seconds, once per
    wheelhouse): compileall runs as a process of its own, on every core."""
    with tempfile.TemporaryDirectory(prefix="clusterd-bytecode-") as scratch:
        root = Path(scratch)
        if not sum(_sources(wheel, root) for wheel in wheels):
            raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                                "building the runtime's bytecode: its wheels hold no module")
        # Exit 1 is "some file did not compile": sources of another Python (templates, tests
        # of vendored code) that no import reaches; Python would fail on them just the same.
        compiled = subprocess.run(
            [sys.executable, "-m", "compileall", "-qq", "-j", "0",
             "--invalidation-mode", "checked-hash", str(root)],
            capture_output=True, text=True, timeout=COMPILE_TIMEOUT_S, check=False)
        if compiled.returncode not in (0, 1):
            raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                                "building the runtime's bytecode failed: "
                                f"{(compiled.stderr or compiled.stdout).strip()[-800:]}")
        partial = target.with_name(target.name + ".part")
        with tarfile.open(partial, "w:gz", compresslevel=6) as tar:
            for pyc in sorted(root.rglob("*.pyc")):
                tar.add(pyc, arcname=str(pyc.relative_to(root)), filter=_plain)
        partial.rename(target)


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner of this machine's, and modes the node's umask narrows as it likes."""
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    member.mode = 0o644
    return member
