"""The runtime on remote nodes: a venv with exactly this daemon's package and a pinned Ray.

The daemon builds a wheelhouse once per version (its own package as a wheel, plus the wheels
the agent needs), ships it to every node, and installs from it without an index: nodes run
exactly the daemon's code, and need no internet. A node whose Python differs from the
daemon's gets the package from the wheelhouse and the rest from the index. A node that already
has this version is left alone (a marker in its venv says so).

A wheelhouse is used only if wheelhouse.py trusts it (who owns it, and the digests recorded
at its build); the daemon checks its copy before each copy to a node, and pip on the node
checks every wheel from it against the digests the daemon checked (`--require-hashes`).
"""

from __future__ import annotations

import dataclasses
import hashlib
import importlib.metadata
import os
import re
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

import anyio

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.runtime import wheelhouse as integrity
from clusterd.runtime.runner import CommandRunner

logger = log.get("clusterd.install")

# What the agent needs on a node, by distribution name; versions come from this package's
# own metadata (pyproject.toml), so they are written down in one place only.
AGENT_DISTRIBUTIONS = ("ray", "grpcio", "protobuf", "aiosqlite", "anyio", "structlog",
                       "psutil", "msgpack", "pyyaml")
READY_MARKER = ".clusterd-ready"
PYTHON_TAG = f"{sys.version_info.major}.{sys.version_info.minor}"


# Not a requirement of clusterd's own (aiobotocore brings it): the nodes' S3 helpers
# (bucket_copy, the instance-profile credentials wait) need it, at the daemon's version.
NODE_ONLY_DISTRIBUTIONS = ("botocore",)


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
    # Each file's sha256, as verified when the wheelhouse was built or found: what it must
    # still hold before a copy to a node, and what pip on the node checks.
    digests: tuple[tuple[str, str], ...]

    @classmethod
    def of(cls, path: Path, digests: dict[str, str]) -> Wheelhouse:
        packages = sorted(n for n in digests if n.startswith("clusterd-") and n.endswith(".whl"))
        if not packages:
            raise integrity.WheelhouseRefused(path, "has no clusterd wheel",
                                              f"remove it (rm -r {path}) and let clusterd "
                                              "build it again")
        return cls(path, path.name, packages[0], tuple(sorted(digests.items())))

    def verify(self) -> None:
        """Blocking: WheelhouseRefused unless the files are still the ones verified before."""
        integrity.verify(self.path, dict(self.digests))

    def require_hashes(self, wheels: list[str] | None = None) -> str:
        """pip's hash-checking requirements for `wheels` (default: every wheel here)."""
        return integrity.hashed_requirements(dict(self.digests), wheels)


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
                _pip("wheel", "--no-deps", "--wheel-dir", str(staging), str(source))
            else:
                _wheel_from_installed(staging)
            requirements = agent_requirements()
            _pip("download", "--only-binary=:all:", "--dest", str(staging), *requirements)
            (staging / "requirements.txt").write_text("\n".join(requirements) + "\n")
            # For installs by hand (the EC2 test bed's runtime image): pip checks each wheel.
            wheels = {p.name: integrity.sha256_of(p) for p in staging.glob("*.whl")}
            (staging / integrity.HASHED_REQUIREMENTS).write_text(
                integrity.hashed_requirements(wheels))
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


def _pip(*args: str) -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check",
                             *args], capture_output=True, text=True)
    if result.returncode != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"building the runtime's wheelhouse failed (pip {args[0]}): "
            f"{result.stderr.strip()[-800:]}",
            "the daemon needs the package index once per version to fetch the agent's wheels; "
            "with none in reach, run `clusterd --prepare-runtime` where there is one (with "
            "the same CLUSTERD_WHEELHOUSE_DIR)",
        )


# The runtime the daemon's commands use on a node: a link to the installed version's venv,
# relative to the login directory (where commands over SSH start).
CURRENT_PYTHON = ".clusterd/current/bin/python"


async def install_runtime(runner: CommandRunner, wheelhouse: Wheelhouse,
                          force: bool = False) -> None:
    """Make sure the node has this runtime and `.clusterd/current` points at it; with
    `force`, install it again even if it claims to be there (it answered with another
    version)."""
    venv = f".clusterd/venvs/{wheelhouse.key}"
    check = await runner.run(["test", "-e", f"{venv}/{READY_MARKER}"], timeout_s=60)
    if force or check.exit_code != 0:
        await _install(runner, wheelhouse, venv)
    linked = await runner.run(["ln", "-sfn", f"venvs/{wheelhouse.key}", ".clusterd/current"],
                              timeout_s=60)
    if linked.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: {linked.error_tail(3)}")


async def _install(runner: CommandRunner, wheelhouse: Wheelhouse, venv: str) -> None:
    remote_house = f".clusterd/wheelhouse/{wheelhouse.key}"
    # Our copy first: changed since it was checked (or built), it goes nowhere.
    await anyio.to_thread.run_sync(wheelhouse.verify)
    await runner.sync_dir(str(wheelhouse.path), f"~/{remote_house}", timeout_s=900)
    version = await runner.run(
        ["python3", "-c", "import sys; print('%d.%d' % sys.version_info[:2])"], timeout_s=60
    )
    if version.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name} has no python3: {version.error_tail(3)}",
                            "install Python 3.11 or newer on the node")
    node_python = version.text.strip()
    offline = node_python == PYTHON_TAG
    # What pip on the node may install from the wheelhouse, each wheel pinned to the digest
    # verified here (from our memory, not from the copy): every wheel when the node's Python
    # is ours; else only the package, the agent's dependencies coming from the index.
    hashes = f"{remote_house}.require-hashes.txt"
    pinned = wheelhouse.require_hashes(None if offline else [wheelhouse.package_wheel])
    written = await runner.run(["sh", "-c", 'cat > "$1"', "sh", hashes],
                               input=pinned.encode(), timeout_s=60)
    if written.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: writing {hashes}: {written.error_tail(3)}")
    made = await runner.run(["python3", "-m", "venv", "--clear", venv], timeout_s=300)
    if made.exit_code != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"creating a venv on {runner.node_name} failed: {made.error_tail(3)}",
            "install the venv module on the node (Debian: apt-get install python3-venv)",
        )
    pip = [f"{venv}/bin/python", "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    steps = [] if offline else [[*pip, "-r", f"{remote_house}/requirements.txt"]]
    # --no-deps: the pinned list is complete (and the package's daemon-only dependencies,
    # such as the cloud SDKs, have no business on a node). pip checks every digest before it
    # installs anything.
    steps.append([*pip, "--no-index", "--no-deps", "--require-hashes",
                  "--find-links", remote_house, "-r", hashes])
    for args in steps:
        installed = await runner.run(args, timeout_s=1800)
        if installed.exit_code != 0:
            output = installed.error_tail(12)
            if "DO NOT MATCH THE HASHES" in output.upper():
                raise ProtocolError(
                    ErrorCode.PROVIDER_ERROR,
                    f"the runtime's wheels on {runner.node_name} do not match the digests "
                    f"recorded when the wheelhouse was built; nothing was installed: {output}",
                    f"someone or something changed ~/{remote_house} on the node; remove it, "
                    "and launch again",
                )
            raise ProtocolError(
                ErrorCode.PROVIDER_ERROR,
                f"installing the runtime on {runner.node_name} failed: {output}",
            )
    await runner.run(["touch", f"{venv}/{READY_MARKER}"], timeout_s=60)
    logger.info("runtime installed", node=runner.node_name, key=wheelhouse.key,
                offline=offline)
