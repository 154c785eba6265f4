"""A CPython of the daemon's minor that runs on an old glibc, for the EC2 bed's Python mirror.

python-build-standalone's CPython (what uv installs on a node with no usable Python) is built
against glibc 2.17, so it runs on any current Linux image. The machine's pyenv CPython
(python_mirror.standalone_archive) is linked against this machine's glibc (2.36) and does not
load on the bed's Ubuntu 22.04 stand-in, a bullseye root (glibc 2.31). So the bed's mirror
serves one built inside that root, from CPython's source as Debian's archive has it (its
`orig` tarball, checked against the digest here), in the same `install_only` layout; its
libpython is static, so it runs from wherever uv unpacks it. Built once per machine (minutes),
kept in CLUSTERD_TESTBED_CACHE (default /var/cache/clusterd-testbed)/python.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

from tests.python_mirror import _LEFT_OUT, CACHE

ROOT = Path(__file__).resolve().parents[1]
# The daemon's minor -> (version, Debian's source package tarball, its sha256 in Debian's
# bookworm Sources index): the source the archive is built from.
SOURCES = {
    "3.11": ("3.11.2", "pool/main/p/python3.11/python3.11_3.11.2.orig.tar.gz",
             "2411c74bda5bbcfcddaf4531f66d1adc73f247f529aee981b029513aefdbf849"),
}
# What the build needs in the root, and what its standard library must import after.
BUILD_PACKAGES = ("gcc", "make", "libc6-dev", "libssl-dev", "zlib1g-dev", "libffi-dev",
                  "libbz2-dev", "liblzma-dev", "libsqlite3-dev")
CHECK = "import ssl, zlib, ctypes, sqlite3, bz2, lzma, venv"
BUILD_TIMEOUT_S = 3600
_BED = ("import json, sys; sys.path.insert(0, 'scripts'); from _testbed.ec2 import images; "
        "from _testbed.common import debian_mirror; "
        "print(json.dumps([images.ensure_root('bullseye'), debian_mirror()]))")


def _build_script(version: str) -> str:
    return f"""set -e
apt-get update -q >/dev/null
DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends \
  {" ".join(BUILD_PACKAGES)} >/dev/null 2>&1
mkdir -p /build && cd /build && tar xzf /src.tar.gz && cd Python-{version}
./configure -q --prefix=/opt/python >/dev/null
make -s -j2 >/dev/null 2>&1
make -s install >/dev/null 2>&1
/opt/python/bin/python3 -c "{CHECK}"
"""


def old_glibc_archive() -> tuple[Path, str]:
    """The archive (built the first time, in the bed's bullseye root) and its version."""
    minor = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert minor in SOURCES, f"no CPython {minor} source named in {__file__}: add it"
    version, source, digest = SOURCES[minor]
    target = (CACHE / "python" /
              f"cpython-{version}-x86_64-unknown-linux-gnu-install_only-glibc2.31.tar.gz")
    if target.exists():
        return target, version
    root, mirror = json.loads(subprocess.run(
        [sys.executable, "-c", _BED], cwd=ROOT, check=True, capture_output=True, text=True,
        timeout=1800).stdout)
    target.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=target.parent, prefix="oldglibc-") as scratch:
        build = Path(scratch) / "root"
        # A copy: the image root the bed's nodes boot in stays as it was.
        subprocess.run(["cp", "-a", root, str(build)], check=True, timeout=600)
        shutil.copy2("/etc/resolv.conf", build / "etc" / "resolv.conf")
        subprocess.run(["curl", "-sSfo", str(build / "src.tar.gz"), f"{mirror}/{source}"],
                       check=True, timeout=600)
        subprocess.run(["sha256sum", "-c", "-"], input=f"{digest}  {build}/src.tar.gz\n",
                       capture_output=True, text=True, check=True, timeout=60)
        done = subprocess.run(
            ["unshare", "-m", "--propagation", "private", "sh", "-c",
             'mount -t proc proc "$1/proc" && exec chroot "$1" env -i '
             'PATH=/usr/bin:/bin:/usr/sbin:/sbin HOME=/root sh -c "$2"', "sh", str(build),
             _build_script(version)],
            capture_output=True, text=True, timeout=BUILD_TIMEOUT_S)
        assert done.returncode == 0, f"building CPython {version} failed: {done.stderr[-3000:]}"
        built = build / "opt" / "python"
        python = Path(scratch) / "python"
        (python / "lib").mkdir(parents=True)
        shutil.copytree(built / "bin", python / "bin", symlinks=True)
        shutil.copytree(built / "lib" / f"python{minor}", python / "lib" / f"python{minor}",
                        symlinks=True,
                        ignore=lambda _dir, names: [n for n in names if n in _LEFT_OUT])
        partial = Path(scratch) / target.name  # a worker building it too has its own
        with tarfile.open(partial, "w:gz", compresslevel=1) as archive:
            archive.add(python, arcname="python")
        os.rename(partial, target)
    return target, version
