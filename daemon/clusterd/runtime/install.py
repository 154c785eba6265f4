"""The runtime on remote nodes: a venv with exactly this daemon's package and a pinned Ray.

The daemon builds a wheelhouse once per version (its own package as a wheel, plus the wheels
the agent needs, plus uv's wheel) and, from it, the venv a node runs as one archive, with the
runtime's bytecode compiled once here (bytecode.py). A node of the daemon's kind (its Python
minor, CPU and glibc: node_platform.py) gets that archive streamed and unpacked as it
arrives (venv_archive.py): no index, no resolver, nothing compiled on the node, and it runs
exactly the daemon's code. Any other node gets a wheelhouse built for it (foreign_house.py,
node_install.py). Ray's wheel comes without the libraries no node of ours runs, and botocore
without the models of AWS services no node calls (slim.py: 40 of Ray's 79 MB, 15 of
botocore's 16). A node that already has this version is left alone (a marker in its venv
says so).

A wheelhouse is used only if wheelhouse.py trusts it (who owns it, and the digests recorded
at its build); the daemon checks its copy before each install on a node. On the node, what
arrived is checked against the digests the daemon verified, held in its memory: the archive
as it is unpacked (the venv is marked ready only if it matches), or each copied wheel as uv
installs it (`--require-hashes`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import re
import shutil
import tempfile
import time
import zipfile
from collections.abc import Iterable
from pathlib import Path

import anyio

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.commands import SKYIGNORE
from clusterd.runtime import build_lock, bytecode, foreign_house, node_binary, slim, venv_archive
from clusterd.runtime import wheelhouse as integrity
from clusterd.runtime.foreign_house import ForeignHouse
from clusterd.runtime.node_platform import (
    NodePlatform,
    PythonSource,
    RuntimeTarget,
    daemon_target,
    matches_daemon,
    probe_script,
)
from clusterd.runtime.pip import pip_run
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

    def verify(self, archives: Iterable[str] | None = None) -> None:
        """Blocking: WheelhouseRefused unless the files are still the ones verified before;
        given the archives about to be sent (to the nodes whose platform is ours), only
        those are hashed (any other node gets a wheelhouse of its own: foreign_house.py)."""
        integrity.verify(self.path, dict(self.digests), None if archives is None
                         else set(archives))

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


# What building the package from a checkout reads (pyproject.toml's packages, readme).
CHECKOUT_BUILD_INPUTS = ("pyproject.toml", "README.md", "daemon/clusterd", "ctl/clusterctl")


def _wheel_from_checkout(source: Path, out_dir: Path) -> None:
    """The package's wheel, built from a copy of the checkout's sources: setuptools writes
    build/ and *.egg-info inside the tree it builds, where two daemons building at once
    collided (and a user's checkout would fill with build output)."""
    with tempfile.TemporaryDirectory(prefix="clusterd-source-") as copy:
        tree = Path(copy)
        ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info")
        for name in CHECKOUT_BUILD_INPUTS:
            origin = source / name
            if origin.is_dir():
                shutil.copytree(origin, tree / name, ignore=ignore, symlinks=True)
            elif origin.exists():
                shutil.copy2(origin, tree / name)
        pip_run("wheel", "--no-deps", "--wheel-dir", str(out_dir), str(tree))


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
    """The daemon's wheelhouse (its own kind of node), and for every other kind of node a
    wheelhouse of its own (foreign_house.py), uv for the nodes that get one, and where a
    node with no usable Python gets a CPython from (`python_source`)."""

    def __init__(self, root: Path, python_source: PythonSource | None = None) -> None:
        self._root = root
        self._lock = anyio.Lock()
        self._built: Wheelhouse | None = None
        self.python_source = python_source or PythonSource()
        self._foreign_locks: dict[str, anyio.Lock] = {}

    async def foreign(self, wheelhouse: Wheelhouse, target: RuntimeTarget) -> ForeignHouse:
        """The runtime's wheelhouse for nodes of `target` (built from the index once: one
        build per target at a time)."""
        lock = self._foreign_locks.setdefault(target.tag, anyio.Lock())
        async with lock:
            return await anyio.to_thread.run_sync(
                foreign_house.build, self._root, wheelhouse.key,
                wheelhouse.path / wheelhouse.package_wheel, agent_requirements(), target)

    async def node_uv(self, machine: str) -> Path:
        """uv's binary for nodes of this CPU (its wheel's, at the daemon's uv version)."""
        async with self._lock:
            return await anyio.to_thread.run_sync(self.node_uv_now, machine)

    def node_uv_now(self, machine: str) -> Path:
        """node_uv, blocking: call it from a thread inside the daemon."""
        return node_binary.fetch(self._root, INSTALLER_DISTRIBUTION,
                                 importlib.metadata.version(INSTALLER_DISTRIBUTION), machine,
                                 "uv")

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
        with build_lock.one_builder(self._root, key):
            if os.path.lexists(final):  # built by another daemon while we waited
                return Wheelhouse.of(final, integrity.verify(final))
            return self._build_new(key, final)

    def _build_new(self, key: str, final: Path) -> Wheelhouse:
        with tempfile.TemporaryDirectory(dir=self._root) as scratch:
            staging = Path(scratch)
            source = _source_root()
            if source is not None:
                _wheel_from_checkout(source, staging)
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


# The runtime the daemon's commands use on a node: a link to the installed version's venv,
# relative to the login directory (where commands over SSH start).
CURRENT_LINK = ".clusterd/current"
CURRENT_PYTHON = f"{CURRENT_LINK}/bin/python"


RECEIVE_TIMEOUT_S = 1800  # the runtime's stream to one node, over the slowest link we serve

# A worker's unpacking yields the CPU to the head's Ray start where both share a host (nodes
# of an SSH pool on one machine, pods on one Kubernetes node, the test beds): the head's
# start is on every launch's path, a worker's install only until the head is up. On a
# machine of its own nothing else runs, and it costs nothing.
BEHIND_HEAD_NICENESS = 10


def archive_for(node: NodePlatform) -> str | None:
    """The runtime's archive (of the daemon's own venv) `node` unpacks; None: the node is not
    of the daemon's kind (Python minor, CPU, glibc), and gets a runtime built for it."""
    if node.python is None or not matches_daemon(node.target(), daemon_target()):
        return None
    return venv_archive.archive_for(node.has_zstd)


async def receive_archive(runner: CommandRunner, wheelhouse: Wheelhouse, node: NodePlatform,
                          behind_head: bool = False) -> None:
    """Stream the runtime's archive to `node` (of the daemon's kind: archive_for), verified
    by the caller, and make it the current runtime there."""
    name = archive_for(node)
    assert name is not None
    assert node.executable is not None
    await _receive_archive(runner, wheelhouse, name, node.executable,
                           BEHIND_HEAD_NICENESS if behind_head else 0)


_LINKED = "linked"


async def linked_or_probed(runner: CommandRunner, wheelhouse: Wheelhouse,
                           force: bool = False) -> NodePlatform | None:
    """If the node has this runtime (built for it: any of KEY and KEY-for-TAG) and not
    `force`, make it the current one and say None; else what the node is
    (node_platform.py), to install the runtime with. One round trip either way (a start of a
    stopped cluster waits on it)."""
    venvs = f"{_venv(wheelhouse)} {_venv(wheelhouse)}-for-*"
    linked = (f'for d in {venvs}; do if test -e "$d/$1"; then '
              f'ln -sfn "venvs/${{d##*/}}" "$2" && echo {_LINKED} && exit; fi; done; '
              if not force else '')
    found = await runner.run(["sh", "-c", linked + probe_script(), "sh", READY_MARKER,
                              CURRENT_LINK], timeout_s=60)
    said = found.text.strip()
    if found.exit_code == 0 and said == _LINKED:
        return None
    if found.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"cannot tell what {runner.node_name} is: {found.error_tail(3)}",
                            "the node needs a POSIX sh, uname and getconf")
    return NodePlatform.parse(said)


async def _receive_archive(runner: CommandRunner, wheelhouse: Wheelhouse, name: str,
                           python: str, niceness: int) -> None:
    started = time.monotonic()
    archive = wheelhouse.path / name
    received = await runner.run(
        venv_archive.receive_command(name, _venv(wheelhouse), dict(wheelhouse.digests)[name],
                                     READY_MARKER, niceness, CURRENT_LINK,
                                     _current_target(wheelhouse), python),
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


def remote_house(key: str) -> str:
    """Where a copy of the wheelhouse KEY lies on a node (relative to its login directory)."""
    return f".clusterd/wheelhouse/{key}"


async def link_current(runner: CommandRunner, key: str) -> None:
    """Make the node's venv KEY its current runtime."""
    linked = await runner.run(["ln", "-sfn", f"venvs/{key}", CURRENT_LINK], timeout_s=60)
    if linked.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: {linked.error_tail(3)}")
