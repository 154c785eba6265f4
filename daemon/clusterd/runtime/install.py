"""The runtime on remote nodes: a venv with exactly this daemon's package and a pinned Ray.

The daemon builds a wheelhouse once per version (its own package as a wheel, plus the wheels
the agent needs, plus uv's wheel) and, from it, the venv a node runs as one archive, with the
runtime's bytecode compiled once here (bytecode.py). A node whose Python is the daemon's gets
that archive streamed and unpacked as it arrives (venv_archive.py): no index, no resolver,
nothing compiled on the node, and it runs exactly the daemon's code. A node whose Python
differs gets a copy of the wheelhouse, the package from it and the rest from the index, with
pip (which reads the node's own pip configuration, mirrors included). Ray's wheel comes
without the libraries no node of ours runs, and botocore without the models of AWS services
no node calls (slim.py: 40 of Ray's 79 MB, 15 of botocore's 16). A node that already has
this version is left alone (a marker in its venv says so).

A wheelhouse is used only if wheelhouse.py trusts it (who owns it, and the digests recorded
at its build); the daemon checks its copy before each install on a node. On the node, what
arrived is checked against the digests the daemon verified, held in its memory: the archive
as it is unpacked (the venv is marked ready only if it matches), or each copied wheel before
uv is unpacked from its wheel, and uv (or pip) checks them again as it installs
(`--require-hashes`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import tempfile
import time
import zipfile
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

import anyio

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.commands import SKYIGNORE
from clusterd.runtime import bytecode, slim, venv_archive
from clusterd.runtime import wheelhouse as integrity
from clusterd.runtime.runner import CommandRunner
from clusterd.runtime.venv_archive import PYTHON_TAG

logger = log.get("clusterd.install")

# What the agent needs on a node, by distribution name; versions come from this package's
# own metadata (pyproject.toml), so they are written down in one place only.
AGENT_DISTRIBUTIONS = ("ray", "grpcio", "protobuf", "aiosqlite", "anyio", "structlog",
                       "psutil", "msgpack", "pyyaml")
READY_MARKER = ".clusterd-ready"


# Not a requirement of clusterd's own (aiobotocore brings it): the nodes' S3 helpers
# (bucket_copy, the instance-profile credentials wait) need it, at the daemon's version.
NODE_ONLY_DISTRIBUTIONS = ("botocore",)
# Shipped in the wheelhouse to install the rest; never installed into the venv itself.
INSTALLER_DISTRIBUTION = "uv"


def installer_requirement() -> str:
    return f"{INSTALLER_DISTRIBUTION}=={importlib.metadata.version(INSTALLER_DISTRIBUTION)}"


def _is_installer_wheel(name: str) -> bool:
    return name.startswith(f"{INSTALLER_DISTRIBUTION}-") and name.endswith(".whl")


def agent_requirements() -> list[str]:
    requirements = importlib.metadata.requires("clusterd") or []
    wanted = [f"{name}=={importlib.metadata.version(name)}"
              for name in NODE_ONLY_DISTRIBUTIONS]
    for requirement in requirements:
        if ";" in requirement:
            continue  # extras (dev tools) are not for nodes
        name = re.split(r"[<>=!~\[ ]", requirement, maxsplit=1)[0].lower()
        if name in AGENT_DISTRIBUTIONS:
            wanted.append(requirement)
    return wanted


@dataclasses.dataclass(frozen=True)
class NodePython:
    """A node's python3, as probed: its X.Y, whether zstd is on its PATH, its executable."""

    version: str
    has_zstd: bool
    executable: str

    @property
    def archive(self) -> str | None:
        """The runtime's archive the node unpacks; None: its Python is not ours, and it
        installs from a copy of the wheelhouse."""
        return venv_archive.archive_for(self.has_zstd) if self.version == PYTHON_TAG else None


@dataclasses.dataclass(frozen=True)
class Wheelhouse:
    path: Path
    key: str  # identifies this exact runtime: version plus a digest of the wheels
    package_wheel: str
    installer_wheel: str
    # Each file's sha256, as verified when the wheelhouse was built or found: what it must
    # still hold before a copy to a node, and what pip on the node checks.
    digests: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, path: Path, digests: dict[str, str]) -> Wheelhouse:
        def lacking(what: str) -> integrity.WheelhouseRefused:
            return integrity.WheelhouseRefused(
                path, f"has no {what} (made by an older clusterd?)",
                f"remove it (rm -r {path}) and let clusterd build it again")

        packages = sorted(n for n in digests if n.startswith("clusterd-") and n.endswith(".whl"))
        if not packages:
            raise lacking("clusterd wheel")
        installers = sorted(n for n in digests if _is_installer_wheel(n))
        if not installers:
            raise lacking(f"{INSTALLER_DISTRIBUTION} wheel")
        for archive in venv_archive.ARCHIVES:
            if archive not in digests:
                raise lacking(f"runtime archive {archive}")
        return cls(path, path.name, packages[0], installers[0],
                   tuple(sorted(digests.items())))

    def verify(self, pythons: Iterable[NodePython] | None = None) -> None:
        """Blocking: WheelhouseRefused unless the files are still the ones verified before;
        given the Pythons of the nodes about to get it, only what is sent to them is hashed
        (the archive for a node whose Python is ours, the wheels for any other)."""
        hashing = None
        if pythons is not None:
            hashing = set()
            for python in pythons:
                if python.archive is not None:
                    hashing.add(python.archive)
                else:
                    hashing |= {n for n, _ in self.digests if n not in venv_archive.ARCHIVES}
        integrity.verify(self.path, dict(self.digests), hashing)

    def runtime_wheels(self) -> list[str]:
        """The wheels that make the node's venv: all but the installer's."""
        return [n for n, _ in self.digests if n.endswith(".whl") and not _is_installer_wheel(n)]

    def require_hashes(self, wheels: list[str] | None = None) -> str:
        """Hash-checking requirements (pip's and uv's `--require-hashes` format) for `wheels`
        (default: every wheel of the venv)."""
        return integrity.hashed_requirements(
            dict(self.digests), self.runtime_wheels() if wheels is None else wheels)


def _source_root() -> Path | None:
    """The project checkout this package runs from, if any (an editable install)."""
    root = Path(__file__).resolve().parents[3]
    return root if (root / "pyproject.toml").exists() and (root / "daemon").is_dir() else None


def _installed_distribution() -> importlib.metadata.Distribution:
    # The distribution installed beside this very package: looking it up by name alone could
    # find another (say, a checkout's egg-info that happens to be on sys.path).
    here = str(Path(__file__).resolve().parents[2])
    found = [d for d in importlib.metadata.distributions(path=[here])
             if (d.metadata["Name"] or "").lower() == "clusterd"]
    return found[0] if found else importlib.metadata.distribution("clusterd")


def _wheel_from_installed(out_dir: Path) -> Path:
    """This package as a wheel, zipped from its installed files (a regular install has no
    source tree to build from)."""
    dist = _installed_distribution()
    name = f"clusterd-{__version__}-py3-none-any.whl"
    target = out_dir / name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as wheel:
        for file in dist.files or []:
            parts = file.parts
            if "__pycache__" in parts or parts[0].startswith("..") or file.suffix == ".pyc":
                continue
            if parts[0].endswith(".dist-info") and file.name in ("RECORD", "INSTALLER",
                                                                 "direct_url.json"):
                continue
            source = Path(str(file.locate()))
            if source.is_file():
                wheel.write(source, str(file))
        info = [p for p in (dist.files or []) if p.parts[0].endswith(".dist-info")]
        if not info:
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"cannot build the runtime's wheel: the clusterd found at {dist.locate_file('')} "
                "is not an installed wheel",
                "run clusterd from a regular or editable pip install",
            )
        wheel.writestr(f"{info[0].parts[0]}/RECORD", "")
    return target


def _content_digest() -> str:
    """Identifies this package's code without building anything: a digest of its source files
    (a checkout) or its installed files. A wheelhouse made elsewhere from the same code (say,
    before entering a network namespace with no index) is found by it and reused."""
    digest = hashlib.sha256()
    source = _source_root()
    if source is not None:
        files = sorted(
            p for top in ("daemon/clusterd", "ctl/clusterctl") for p in (source / top).rglob("*")
            if p.is_file() and "__pycache__" not in p.parts and p.suffix != ".pyc"
        )
        for path in [*files, source / "pyproject.toml"]:
            digest.update(str(path.relative_to(source)).encode() + b"\0")
            digest.update(path.read_bytes())
        return digest.hexdigest()[:12]
    dist = _installed_distribution()
    for file in sorted(dist.files or [], key=str):
        if file.suffix == ".pyc" or "__pycache__" in file.parts or file.name == "RECORD":
            continue
        path = Path(str(file.locate()))
        if path.is_file():
            digest.update(str(file).encode() + b"\0")
            digest.update(path.read_bytes())
    return digest.hexdigest()[:12]


def wheelhouse_key() -> str:
    """The name of this exact code's wheelhouse: version, Python, a digest of the code."""
    return f"{__version__}-py{PYTHON_TAG}-{_content_digest()}"


class WheelhouseBuilder:
    def __init__(self, root: Path) -> None:
        self._root = root
        self._lock = anyio.Lock()
        self._built: Wheelhouse | None = None

    async def ensure(self) -> Wheelhouse:
        async with self._lock:
            if self._built is None or not self._built.path.is_dir():
                self._built = await anyio.to_thread.run_sync(self.build)
            return self._built

    def build(self) -> Wheelhouse:
        """The wheelhouse of this exact code: found if it exists (and is trusted: see
        wheelhouse.py; else WheelhouseRefused, never a silent rebuild), else built (which
        needs the package index once). Blocking: call it from a thread inside the daemon."""
        key = wheelhouse_key()
        final = self._root / key
        self._root.mkdir(parents=True, exist_ok=True)
        integrity.check_trusted(self._root, directory=True)
        if os.path.lexists(final):
            return Wheelhouse.of(final, integrity.verify(final))
        with tempfile.TemporaryDirectory(dir=self._root) as scratch:
            staging = Path(scratch)
            source = _source_root()
            if source is not None:
                pip_run("wheel", "--no-deps", "--wheel-dir", str(staging), str(source))
            else:
                _wheel_from_installed(staging)
            requirements = agent_requirements()
            pip_run("download", "--only-binary=:all:", "--dest", str(staging), *requirements,
                 installer_requirement())
            (staging / "requirements.txt").write_text("\n".join(requirements) + "\n")
            runtime_wheels = [p for p in staging.glob("*.whl")
                              if not _is_installer_wheel(p.name)]
            for wheel in runtime_wheels:
                slimming = slim.slimming_for(wheel.name)
                if slimming is not None:
                    before, after = slim.slim_wheel(wheel, slimming)
                    logger.info("wheel slimmed", wheel=wheel.name,
                                before_mb=round(before / 1e6, 1), after_mb=round(after / 1e6, 1))
            # For installs by hand (the test beds' runtime images) and the runtime's
            # archive: pip and uv check each wheel.
            wheels = {p.name: integrity.sha256_of(p) for p in runtime_wheels}
            (staging / integrity.HASHED_REQUIREMENTS).write_text(
                integrity.hashed_requirements(wheels))
            with tempfile.TemporaryDirectory(prefix="clusterd-bytecode-") as compiled:
                bytecode_archive = Path(compiled) / bytecode.ARCHIVE
                bytecode.build_archive(runtime_wheels, bytecode_archive)
                venv_archive.build(staging, staging / integrity.HASHED_REQUIREMENTS,
                                   bytecode_archive, staging)
            # A node with another Python gets a copy of the wheels (rsync reads this), not
            # the archives it has no use for.
            (staging / SKYIGNORE).write_text("".join(f"/{name}\n"
                                                     for name in venv_archive.ARCHIVES))
            digests = integrity.write_sums(staging)  # last: the build is complete
            try:
                staging.rename(final)
            except OSError:
                if not os.path.lexists(final):
                    raise
                # Another daemon of this user built it meanwhile: theirs, checked as any.
                return Wheelhouse.of(final, integrity.verify(final))
            Path(scratch).mkdir()  # TemporaryDirectory wants something to remove
        logger.info("wheelhouse built", key=key, path=str(final))
        return Wheelhouse.of(final, digests)


def pip_run(*args: str, building: str = "the runtime's wheelhouse") -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check",
                             *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"building {building} failed (pip {args[0]}): "
            f"{result.stderr.strip()[-800:]}",
            "the daemon needs the package index once per version to fetch the agent's wheels; "
            "with none in reach, run `clusterd --prepare-runtime` where there is one (with "
            "the same CLUSTERD_WHEELHOUSE_DIR)",
        )


# The runtime the daemon's commands use on a node: a link to the installed version's venv,
# relative to the login directory (where commands over SSH start).
CURRENT_LINK = ".clusterd/current"
CURRENT_PYTHON = f"{CURRENT_LINK}/bin/python"


async def install_runtime(runner: CommandRunner, wheelhouse: Wheelhouse,
                          force: bool = False) -> None:
    """Make sure the node has this runtime and `.clusterd/current` points at it; with
    `force`, install it again even if it claims to be there (it answered with another
    version). The steps one by one (a launch runs them node by node: install_round.py)."""
    python = await linked_or_probed(runner, wheelhouse, force)
    if python is not None:
        # Our copy first: changed since it was checked (or built), it goes nowhere.
        await anyio.to_thread.run_sync(wheelhouse.verify, [python])
        await install_checked(runner, wheelhouse, python)


RECEIVE_TIMEOUT_S = 1800  # the runtime's stream to one node, over the slowest link we serve

# A worker's unpacking yields the CPU to the head's Ray start where both share a host (nodes
# of an SSH pool on one machine, pods on one Kubernetes node, the test beds): the head's
# start is on every launch's path, a worker's install only until the head is up. On a
# machine of its own nothing else runs, and it costs nothing.
BEHIND_HEAD_NICENESS = 10


async def install_checked(runner: CommandRunner, wheelhouse: Wheelhouse, python: NodePython,
                          announce: Callable[[str], Awaitable[None]] | None = None,
                          behind_head: bool = False,
                          sent: Callable[[], None] | None = None) -> None:
    """Install the runtime on the node whose Python is `python`, from a wheelhouse the caller
    has verified, and make it the current one: the archive of the venv, streamed, on a node
    whose Python is ours (venv_archive.py); else the package's wheel from a copy of the
    wheelhouse and the rest from the node's index. `announce` hears each phase ("copy",
    "install") as it begins; `behind_head`: a worker's (BEHIND_HEAD_NICENESS); `sent` is
    called once nothing more goes from here to the node (the archive is unpacked, or the
    wheelhouse copied: the rest is the node's own work)."""
    if python.archive is not None:
        if announce is not None:
            await announce("install")
        await _receive_archive(runner, wheelhouse, python.archive,
                               BEHIND_HEAD_NICENESS if behind_head else 0)
        if sent is not None:
            sent()
        return
    if announce is not None:
        await announce("copy")
    await copy_wheelhouse(runner, wheelhouse)
    if sent is not None:
        sent()
    if announce is not None:
        await announce("install")
    await install_copied(runner, wheelhouse, python.executable)
    await link_current(runner, wheelhouse)


# The node's python3: its version (X.Y), whether zstd is on its PATH, its executable.
_PROBE = ("import shutil, sys; print('%d.%d' % sys.version_info[:2], "
          "int(bool(shutil.which('zstd'))), sys.executable)")
_LINKED = "linked"


async def linked_or_probed(runner: CommandRunner, wheelhouse: Wheelhouse,
                           force: bool = False) -> NodePython | None:
    """If the node has this runtime (and not `force`), make it the current one and say None;
    else what its python3 is, to install the runtime with. One round trip either way (a
    start of a stopped cluster waits on it)."""
    linked = (f'test -e "$1" && ln -sfn "$2" "$3" && echo {_LINKED} && exit; '
              if not force else '')
    found = await runner.run(
        ["sh", "-c", linked + 'exec python3 -c "$4"', "sh",
         f"{_venv(wheelhouse)}/{READY_MARKER}", _current_target(wheelhouse), CURRENT_LINK,
         _PROBE], timeout_s=60)
    said = found.text.strip()
    if found.exit_code == 0 and said == _LINKED:
        return None
    if found.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name} has no python3: {found.error_tail(3)}",
                            "install Python 3.11 or newer on the node")
    version, has_zstd, executable = said.split(" ", 2)
    return NodePython(version, has_zstd == "1", executable)


async def _receive_archive(runner: CommandRunner, wheelhouse: Wheelhouse, name: str,
                           niceness: int) -> None:
    started = time.monotonic()
    archive = wheelhouse.path / name
    received = await runner.run(
        venv_archive.receive_command(name, _venv(wheelhouse), dict(wheelhouse.digests)[name],
                                     READY_MARKER, niceness, CURRENT_LINK,
                                     _current_target(wheelhouse)),
        input=archive, timeout_s=RECEIVE_TIMEOUT_S)
    if received.exit_code == venv_archive.DIGEST_DIFFERS:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"the runtime that reached {runner.node_name} does not match the digest recorded "
            f"when the wheelhouse was built; nothing of it was kept: {name}",
            "something changed it on the way, or the file here changed while it was sent; "
            "launch again",
        )
    if received.exit_code != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"installing the runtime on {runner.node_name} failed: "
            f"{received.error_tail(8)}",
            "the node needs tar (and gzip or zstd), and room in its home for the runtime (about "
            f"{_installed_mb(archive)} MB)",
        )
    logger.info("runtime installed", node=runner.node_name, key=wheelhouse.key,
                archive=name, seconds=round(time.monotonic() - started, 2))


def _installed_mb(archive: Path) -> int:
    """About what the archive unpacks to: both compress this runtime's tar (Python and its
    binaries) to about 3/10 (203 MB: zstd 58 MB, gzip 61 MB)."""
    return round(archive.stat().st_size * 10 / 3 / 1e6)


def _venv(wheelhouse: Wheelhouse) -> str:
    return f".clusterd/venvs/{wheelhouse.key}"


def _current_target(wheelhouse: Wheelhouse) -> str:
    """The venv as CURRENT_LINK names it (relative: the link sits beside `venvs`)."""
    return f"venvs/{wheelhouse.key}"


def _remote_house(wheelhouse: Wheelhouse) -> str:
    return f".clusterd/wheelhouse/{wheelhouse.key}"


async def copy_wheelhouse(runner: CommandRunner, wheelhouse: Wheelhouse) -> None:
    """The wheelhouse onto the node (rsync: what is there already is not sent again). The
    caller has verified our copy first (Wheelhouse.verify)."""
    await runner.sync_dir(str(wheelhouse.path), f"~/{_remote_house(wheelhouse)}",
                          timeout_s=900)


async def link_current(runner: CommandRunner, wheelhouse: Wheelhouse) -> None:
    linked = await runner.run(["ln", "-sfn", _current_target(wheelhouse), CURRENT_LINK],
                              timeout_s=60)
    if linked.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: {linked.error_tail(3)}")


# Run by the node's python3 before anything is installed (standard library only: the node has
# nothing else yet). Checks the wheels named on stdin ({file: sha256}, the digests the daemon
# verified) and unpacks uv's binary from its wheel, from the very bytes it checked (unless the
# target is "-"). Before an install only uv's own wheel is named: uv checks every other one
# against the same digests (--require-hashes, local files included), and hashing all 265 MB
# here first cost 0.7-0.9 s per node. After a failed install all are, to say which changed.
_CHECK_AND_UNPACK = """
import hashlib, io, json, os, sys, zipfile
house, installer, target = sys.argv[1:4]
kept = io.BytesIO()
for name, digest in sorted(json.load(sys.stdin).items()):
    sha = hashlib.sha256()
    with open(os.path.join(house, name), "rb") as f:
        while block := f.read(1 << 20):
            sha.update(block)
            if name == installer:
                kept.write(block)
    if sha.hexdigest() != digest:
        print(name)
        sys.exit(3)
if target == "-":
    sys.exit(0)
with zipfile.ZipFile(kept) as wheel:
    member = next(n for n in wheel.namelist() if n.endswith(".data/scripts/uv"))
    binary = wheel.read(member)
with open(target + ".part", "wb") as f:
    f.write(binary)
os.chmod(target + ".part", 0o700)
os.replace(target + ".part", target)
"""
DIGESTS_DIFFER = 3


async def install_copied(runner: CommandRunner, wheelhouse: Wheelhouse, executable: str
                         ) -> None:
    """On a node whose Python is not ours (`executable`): a venv of its own with the agent's
    dependencies from the node's index (pip, which reads the node's own configuration,
    mirrors included), and the package from the wheelhouse copied onto the node, checked
    against the digests in our memory first; the ready marker last. Ours, compiled for
    another Python, would be of no use: no bytecode is shipped."""
    venv, remote_house = _venv(wheelhouse), _remote_house(wheelhouse)
    started = time.monotonic()
    wheels = [wheelhouse.package_wheel]
    hashes = f"{remote_house}.require-hashes.txt"
    written = await runner.run(["sh", "-c", 'cat > "$1"', "sh", hashes],
                               input=wheelhouse.require_hashes(wheels).encode(), timeout_s=60)
    if written.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: writing {hashes}: {written.error_tail(3)}")
    digests = dict(wheelhouse.digests)
    checked = {wheelhouse.installer_wheel: digests[wheelhouse.installer_wheel]}
    uv = f"{remote_house}.uv"
    unpacked = await runner.run(
        ["python3", "-c", _CHECK_AND_UNPACK, remote_house, wheelhouse.installer_wheel, uv],
        input=json.dumps(checked).encode(), timeout_s=300)
    if unpacked.exit_code == DIGESTS_DIFFER:
        raise _digests_differ(runner, remote_house, unpacked.text.strip())
    if unpacked.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: unpacking the installer (uv) failed: "
                            f"{unpacked.error_tail(5)}")
    # uv is told everything (no config files, no interpreter downloads, no index): what it
    # does is what is written here. Its cache is beside the venv, on the same mount, so the
    # venv's files are hard links to it, not copies, and it goes once the install is done.
    cache = f"{remote_house}.uv-cache"
    try:
        made = await runner.run([executable, "-m", "venv", "--clear", venv], timeout_s=300)
        if made.exit_code != 0:
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"creating a venv on {runner.node_name} failed: {made.error_tail(3)}",
                "install the venv module on the node (Debian: apt-get install python3-venv)",
            )
        steps = [[f"{venv}/bin/python", "-m", "pip", "install", "-q",
                  "--disable-pip-version-check", "-r", f"{remote_house}/requirements.txt"],
                 # --no-deps: the pinned list is complete (and the package's daemon-only
                 # dependencies, such as the cloud SDKs, have no business on a node). uv
                 # checks the digest before it installs anything.
                 [uv, "--quiet", "--no-config", "--cache-dir", cache, "--offline",
                  "--no-python-downloads", "pip", "install", "--python", f"{venv}/bin/python",
                  "--no-index", "--no-deps", "--require-hashes", "--find-links", remote_house,
                  "-r", hashes]]
        for args in steps:
            installed = await runner.run(args, timeout_s=1800)
            if installed.exit_code != 0:
                output = installed.error_tail(12)
                changed = await _changed_wheel(runner, remote_house, wheelhouse, wheels)
                if changed:
                    raise _digests_differ(runner, remote_house, changed)
                raise ProtocolError(
                    ErrorCode.PROVIDER_ERROR,
                    f"installing the runtime on {runner.node_name} failed: {output}",
                )
    finally:  # the venv's files are links into it: removing it frees nothing they need
        await runner.run(["rm", "-rf", cache], timeout_s=300)
    await runner.run(["touch", f"{venv}/{READY_MARKER}"], timeout_s=60)
    logger.info("runtime installed", node=runner.node_name, key=wheelhouse.key,
                archive=None, seconds=round(time.monotonic() - started, 2))


async def _changed_wheel(runner: CommandRunner, remote_house: str, wheelhouse: Wheelhouse,
                        wheels: list[str]) -> str | None:
    """After a failed install: the first of `wheels` on the node that differs from its
    recorded digest (uv refuses a changed wheel, but may say only that it is no zip)."""
    digests = dict(wheelhouse.digests)
    checked = await runner.run(
        ["python3", "-c", _CHECK_AND_UNPACK, remote_house, wheelhouse.installer_wheel, "-"],
        input=json.dumps({name: digests[name] for name in wheels}).encode(), timeout_s=300)
    return checked.text.strip() or "?" if checked.exit_code == DIGESTS_DIFFER else None


def _digests_differ(runner: CommandRunner, remote_house: str, what: str) -> ProtocolError:
    return ProtocolError(
        ErrorCode.PROVIDER_ERROR,
        f"the runtime's files on {runner.node_name} do not match the digests recorded when "
        f"the wheelhouse was built; nothing was installed: {what}",
        f"someone or something changed ~/{remote_house} on the node; remove it, and launch "
        "again",
    )
