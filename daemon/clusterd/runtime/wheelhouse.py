"""Whether a runtime wheelhouse can be trusted: who could have put it there, and whether its
files are still the ones recorded when it was built.

A wheelhouse (a KEY directory under CLUSTERD_WHEELHOUSE_DIR, which several daemons may share)
holds wheels, requirements.txt, requirements-hashed.txt and SHA256SUMS, the digest of every
other file, written last before the directory is renamed into place. Digests prove nothing by
themselves (whoever can write the directory can write SHA256SUMS too), so the trust comes from
who can write: the root and KEY directories and every file in them must belong to this user or
to root and be writable by nobody else, and none may be a symbolic link. Then every file must
be listed with its digest, and every listed file be there: a change after the build, a partial
copy, or a directory made by hand (a key and a marker) is refused, naming the file.

On a node, pip checks each wheel against the digests the daemon verified, held in its memory
(`--require-hashes`): what arrives is installed only if it is what was checked here.

Standard library only; blocking (hashing reads the files): call it from a thread.
"""

from __future__ import annotations

import hashlib
import os
import re
import stat
from collections.abc import Iterable, Mapping
from pathlib import Path

from clusterctl.protocol import ErrorCode, ProtocolError

SUMS = "SHA256SUMS"
HASHED_REQUIREMENTS = "requirements-hashed.txt"
# sha256sum's format: the digest, two spaces (or " *"), a plain file name (or the one dot
# file a wheelhouse has: what a copy of it to a node leaves out, install.py).
SUMS_LINE = re.compile(r"([0-9a-f]{64}) [ *](\.skyignore|[A-Za-z0-9_][A-Za-z0-9_.+-]*)")
READ_BYTES = 1024 * 1024


class WheelhouseRefused(ProtocolError):
    """A wheelhouse clusterd will not install from, saying which path and why."""

    def __init__(self, path: Path, problem: str, fix: str) -> None:
        super().__init__(ErrorCode.PROVIDER_ERROR,
                         f"refusing the runtime's wheelhouse: {path} {problem}", fix)


def _rebuild_hint(directory: Path) -> str:
    return (f"remove it (rm -r {directory}) and let clusterd build it again "
            "(`clusterd --prepare-runtime`, which needs the package index once)")


def check_trusted(path: Path, *, directory: bool) -> os.stat_result:
    """`path` must be a real directory (or regular file) of this user or root that nobody
    else can write to; else WheelhouseRefused naming who owns it or what its mode is."""
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        raise WheelhouseRefused(path, "is missing", _rebuild_hint(path.parent)) from None
    kind_ok = stat.S_ISDIR(info.st_mode) if directory else stat.S_ISREG(info.st_mode)
    if stat.S_ISLNK(info.st_mode) or not kind_ok:
        what = "a symbolic link" if stat.S_ISLNK(info.st_mode) else "not a regular " + (
            "directory" if directory else "file")
        raise WheelhouseRefused(path, f"is {what}; a wheelhouse is made of real directories "
                                "and files only", f"move it away (rm -r {path})")
    if info.st_uid not in (os.getuid(), 0):
        try:
            import pwd

            owner = f"{pwd.getpwuid(info.st_uid).pw_name} (uid {info.st_uid})"
        except KeyError:
            owner = f"uid {info.st_uid}"
        raise WheelhouseRefused(
            path, f"belongs to {owner}, neither you nor root: whoever owns it decides what "
            "your nodes would run", "point CLUSTERD_WHEELHOUSE_DIR at a directory of your own "
            "(or one of root's), or have it removed")
    if info.st_mode & 0o022:
        raise WheelhouseRefused(
            path, f"has mode {stat.S_IMODE(info.st_mode):04o}: others may write there, and "
            "may have changed what your nodes would run", f"chmod go-w {path}, after checking "
            "what is in it, or remove it")
    return info


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(READ_BYTES):
            digest.update(block)
    return digest.hexdigest()


def write_sums(directory: Path) -> dict[str, str]:
    """Record the digest of every file in `directory` (a wheelhouse being built) in SUMS."""
    digests = {p.name: sha256_of(p) for p in sorted(directory.iterdir())
               if p.name != SUMS and p.is_file()}
    (directory / SUMS).write_text("".join(f"{d}  {n}\n" for n, d in digests.items()))
    return digests


def _read_sums(directory: Path) -> dict[str, str]:
    path = directory / SUMS
    check_trusted(path, directory=False)
    digests = {}
    for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
        match = SUMS_LINE.fullmatch(line)
        if match is None or match[2] == SUMS or match[2] in digests:
            raise WheelhouseRefused(path, f"line {number} is not `DIGEST  FILE`, or names a "
                                    "file twice", _rebuild_hint(directory))
        digests[match[2]] = match[1]
    return digests


def verify(directory: Path, expected: Mapping[str, str] | None = None,
           hashing: Iterable[str] | None = None) -> dict[str, str]:
    """Check the wheelhouse `directory` (and its parent, the wheelhouse root) as the module
    says, against the digests in its SUMS, or `expected` (those checked before, kept in
    memory); with `hashing`, only the files named there are read and hashed (those about
    to be sent), while every file's owner and presence is checked. Returns the digests;
    WheelhouseRefused naming the first file that differs."""
    check_trusted(directory.parent, directory=True)
    check_trusted(directory, directory=True)
    if expected is None:
        if not os.path.lexists(directory / SUMS):
            raise WheelhouseRefused(
                directory, f"has no {SUMS}: it is not a wheelhouse clusterd built (a key and "
                "a ready marker are not enough)", _rebuild_hint(directory))
        expected = _read_sums(directory)
    present = {entry.name for entry in os.scandir(directory)} - {SUMS}
    planted, missing = sorted(present - set(expected)), sorted(set(expected) - present)
    if planted:
        raise WheelhouseRefused(directory / planted[0], "is not among the files recorded when "
                                "the wheelhouse was built", _rebuild_hint(directory))
    if missing:
        raise WheelhouseRefused(directory / missing[0], "was recorded when the wheelhouse was "
                                "built and is missing (a partial copy?)", _rebuild_hint(directory))
    hashed = set(expected if hashing is None else hashing)
    for name, digest in sorted(expected.items()):
        path = directory / name
        check_trusted(path, directory=False)
        if name not in hashed:
            continue
        found = sha256_of(path)
        if found != digest:
            raise WheelhouseRefused(
                path, f"has changed since the wheelhouse was built (sha256 {found}, recorded "
                f"{digest})", _rebuild_hint(directory))
    return dict(expected)


def hashed_requirements(digests: Mapping[str, str], wheels: Iterable[str] | None = None) -> str:
    """pip's requirements in hash-checking mode (`--require-hashes`): `NAME==VERSION
    --hash=sha256:...` for each wheel of `wheels` (default: all), pinned to exactly that file."""
    lines = []
    for name in sorted(digests if wheels is None else wheels):
        if name.endswith(".whl"):
            distribution, version = name.split("-")[:2]
            lines.append(f"{distribution}=={version} --hash=sha256:{digests[name]}\n")
    return "".join(lines)
