"""The runtime as one archive: the venv a node runs, installed and compiled once here per
wheelhouse, then streamed to each node whose Python is the daemon's and unpacked as it arrives.

Installing the wheels on every node (uv, from a copy of the wheelhouse, then the bytecode)
took a copy (rsync, 0.9 s on the EC2 test bed) and then eight commands one after another
(2.0 s). Now one command on the node reads the archive on its stdin, hashes it as `tar`
unpacks it, and makes the venv this node's own: its `pyvenv.cfg` and `bin/python` links name
the node's interpreter (everything else in a venv made with `uv venv --relocatable` holds no
path: console scripts find their Python beside them). Transfer and unpacking overlap, and a
link with a long round trip pays it twice (the probe, then the stream), not ten times. The
archive is zstd-compressed for a node with `zstd` on its PATH, gzip-compressed for others;
unpacking 200 MB is what the node's CPU spends, and zstd spends a fifth of gzip's on it.

Checked as the wheels were: the archive is one of the wheelhouse's files, so the daemon checks
it against the digests recorded at the build before it sends it, and the node hashes what it
received against the digest the daemon sends from its memory. Files are unpacked before the
hash is known, into the new venv's directory, which nothing runs from until the ready marker
is written; a digest that differs removes the directory and writes no marker.
"""

from __future__ import annotations

import gzip
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError

# The same tar, two ways: zstd for nodes that have it (unpacked in 0.2 CPU-s where gzip
# takes 1.0, and smaller: 58 MB to 61), gzip for any other (every tar reads it).
ZSTD_ARCHIVE = f"runtime-{sys.implementation.cache_tag}.tar.zst"
GZIP_ARCHIVE = f"runtime-{sys.implementation.cache_tag}.tar.gz"
ARCHIVES = (ZSTD_ARCHIVE, GZIP_ARCHIVE)
BUILD_TIMEOUT_S = 900
PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"
# What names this machine's interpreter: made on each node for its own (see _RECEIVE).
_NODE_OWN = {"pyvenv.cfg", "bin/python", "bin/python3", f"bin/python{PYTHON_TAG}"}
_DATA_FILTER: dict[str, Any] = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}


def build(wheel_dir: Path, hashed_requirements: Path, compiled: Path, out_dir: Path) -> None:
    """Install the wheels named (with their digests) by `hashed_requirements` from
    `wheel_dir` into a relocatable venv, add the runtime's bytecode (the archive `compiled`:
    bytecode.py), and write the venv, without what names this machine's interpreter, to
    `out_dir` as each of ARCHIVES. Blocking and CPU-heavy (uv, then gzip: about 10 s), once
    per wheelhouse."""
    import zstandard
    from uv import find_uv_bin  # the daemon's own installer, at the version it ships

    with tempfile.TemporaryDirectory(prefix="clusterd-venv-") as scratch:
        venv = Path(scratch) / "venv"
        uv = [find_uv_bin(), "--quiet", "--no-config", "--offline", "--no-python-downloads",
              "--cache-dir", str(Path(scratch) / "cache")]
        _run([*uv, "venv", "--relocatable", "--python", sys.executable, str(venv)], "uv venv")
        _run([*uv, "pip", "install", "--python", str(venv / "bin" / "python"), "--no-index",
              "--no-deps", "--require-hashes", "--link-mode", "copy", "--find-links",
              str(wheel_dir), "-r", str(hashed_requirements)], "uv pip install")
        site_packages = venv / "lib" / f"python{PYTHON_TAG}" / "site-packages"
        with tarfile.open(compiled) as pycs:
            # Ours, made a moment ago; the filter where this Python has it (Debian's 3.11.2
            # predates extraction filters, 3.14 wants one named).
            pycs.extractall(site_packages, **_DATA_FILTER)
        plain = Path(scratch) / "runtime.tar"
        with tarfile.open(plain, "w") as archive:
            for path in _walk(venv):
                relative = path.relative_to(venv).as_posix()
                if relative not in _NODE_OWN:
                    archive.add(path, arcname=relative, recursive=False, filter=_plain)
        with plain.open("rb") as source, (out_dir / ZSTD_ARCHIVE).open("wb") as target:
            zstandard.ZstdCompressor(level=3, threads=-1).copy_stream(source, target)
        # mtime=0: the same tar gives the same bytes.
        with plain.open("rb") as source, gzip.GzipFile(out_dir / GZIP_ARCHIVE, "wb", 6,
                                                         mtime=0) as target:
            shutil.copyfileobj(source, target, 1 << 20)


def _run(argv: list[str], what: str) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=BUILD_TIMEOUT_S,
                          check=False)
    if done.returncode != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"building the runtime's archive failed ({what}): "
                            f"{(done.stderr or done.stdout).strip()[-800:]}")


def _walk(root: Path) -> list[Path]:
    """Every entry under `root`, sorted (the same archive for the same files), directories
    before what they hold."""
    found: list[Path] = []
    for directory, dirs, files in os.walk(root):
        dirs.sort()
        base = Path(directory)
        found.extend(base / name for name in [*dirs, *sorted(files)])
    return sorted(found, key=lambda p: p.relative_to(root).parts)


def _plain(member: tarfile.TarInfo) -> tarfile.TarInfo:
    """No owner of this machine's, no time of its build; executables stay executable."""
    member.uid = member.gid = 0
    member.uname = member.gname = ""
    member.mtime = 0
    if not member.issym():
        member.mode = 0o755 if member.isdir() or member.mode & 0o111 else 0o644
    return member


# Run by the node's python3 with the archive on stdin. It hashes what it reads while tar
# unpacks it into a fresh venv directory, then makes the venv the node's: its interpreter's
# links and pyvenv.cfg (what `python -m venv` writes), the ready marker, and last the link
# that makes it the current runtime (replaced at once, as `ln -sfn` would).
_RECEIVE = """
import hashlib, os, platform, shutil, subprocess, sys
venv, digest, marker, unpacker, niceness, link, link_target = sys.argv[1:8]
os.nice(int(niceness))  # tar and its unpacker too
shutil.rmtree(venv, ignore_errors=True)
os.makedirs(venv)
tar = subprocess.Popen(["tar", "-x", "--use-compress-program=" + unpacker, "-f", "-",
                        "--no-same-owner", "-C", venv], stdin=subprocess.PIPE)
sha = hashlib.sha256()
feeding = True  # until tar stops reading: the rest is still hashed, to say which failed
while block := sys.stdin.buffer.read1(1 << 20):
    sha.update(block)
    if feeding:
        try:
            tar.stdin.write(block)
        except BrokenPipeError:
            feeding = False
try:
    tar.stdin.close()
except BrokenPipeError:
    pass
unpacked = tar.wait()
if sha.hexdigest() != digest or unpacked != 0:
    shutil.rmtree(venv, ignore_errors=True)
    sys.exit(3 if sha.hexdigest() != digest else 4)
bin_dir = os.path.join(venv, "bin")
python = getattr(sys, "_base_executable", None) or sys.executable  # in a venv: its base's
os.symlink(python, os.path.join(bin_dir, "python"))
for name in ("python3", "python%d.%d" % sys.version_info[:2]):
    os.symlink("python", os.path.join(bin_dir, name))
with open(os.path.join(venv, "pyvenv.cfg"), "w") as cfg:
    cfg.write("home = %s\\nimplementation = CPython\\nversion_info = %s\\n"
              "include-system-site-packages = false\\nrelocatable = true\\n"
              % (os.path.dirname(python), platform.python_version()))
open(os.path.join(venv, marker), "w").close()
if os.path.lexists(link + ".new"):
    os.remove(link + ".new")
os.symlink(link_target, link + ".new")
os.replace(link + ".new", link)
"""
DIGEST_DIFFERS = 3
UNPACK_FAILED = 4


def receive_command(archive: str, venv: str, digest: str, marker: str, niceness: int,
                    link: str, link_target: str, python: str = "python3") -> list[str]:
    """The node's command that makes `venv` from `archive` (one of ARCHIVES: its bytes come
    on stdin), marks it ready and points the symbolic link `link` at `link_target` (the
    venv, as the link sees it); exit DIGEST_DIFFERS (nothing left, the link as it was) if
    what arrived is not the recorded archive, UNPACK_FAILED if tar failed (its message on
    stderr). With `niceness`, it yields the CPU to whatever else runs there (install.py).
    `python` is the node's interpreter the venv is made for."""
    return [python, "-c", _RECEIVE, venv, digest, marker,
            "zstd" if archive == ZSTD_ARCHIVE else "gzip", str(niceness), link, link_target]


def archive_for(node_has_zstd: bool) -> str:
    return ZSTD_ARCHIVE if node_has_zstd else GZIP_ARCHIVE
