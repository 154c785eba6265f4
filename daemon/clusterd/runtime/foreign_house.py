"""The runtime's wheels for a node that is not the daemon's kind: another Python minor,
another CPU, an older glibc (or a daemon on a Mac, whose wheels no node runs).

Built once per target (node_platform.RuntimeTarget) from the package index, the way the
daemon's own wheelhouse is: the same pins (this package's metadata), resolved and fetched for
the target's Python, ABI and manylinux platforms (`pip download --python-version --abi
--platform --only-binary=:all:`), Ray's and botocore's wheels slimmed as for the daemon's
(slim.py), and this package's own wheel copied from the daemon's wheelhouse. Kept beside it
as `KEY-for-TAG` (KEY: the daemon's wheelhouse, TAG: the target's), with SHA256SUMS last, and
trusted as any wheelhouse is (wheelhouse.py). No native wheel of the daemon's ever goes into
it. The node installs from a copy with uv, offline, each wheel checked against the digests
held here (foreign_install.py).

Building one is minutes (Ray alone is 70 MB): the first launch on a new kind of node says so.
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.runtime import build_lock, slim
from clusterd.runtime import wheelhouse as integrity
from clusterd.runtime.node_platform import RuntimeTarget, uv_platform
from clusterd.runtime.pip import PIP_TIMEOUT_S, pip_run

logger = log.get("clusterd.runtime")


@dataclasses.dataclass(frozen=True)
class ForeignHouse:
    path: Path
    key: str
    digests: tuple[tuple[str, str], ...]

    def wheels(self) -> list[str]:
        return [n for n, _ in self.digests if n.endswith(".whl")]

    def verify(self) -> None:
        """Blocking: WheelhouseRefused unless every file is still the one verified before."""
        integrity.verify(self.path, dict(self.digests))

    def require_hashes(self) -> str:
        return integrity.hashed_requirements(dict(self.digests), self.wheels())


def foreign_key(base_key: str, target: RuntimeTarget) -> str:
    return f"{base_key}-for-{target.tag}"


def build(root: Path, base_key: str, package_wheel: Path, requirements: list[str],
          target: RuntimeTarget) -> ForeignHouse:
    """The wheelhouse of `requirements` (with `package_wheel`) for `target`: found (and
    trusted) if built before, else built from the package index. Blocking: call it from a
    thread."""
    key = foreign_key(base_key, target)
    final = root / key
    integrity.check_trusted(root, directory=True)
    if os.path.lexists(final):
        return ForeignHouse(final, key, tuple(sorted(integrity.verify(final).items())))
    platforms = target.platforms()  # refuses a target no wheel is made for, before fetching
    with build_lock.one_builder(root, key):
        if os.path.lexists(final):  # built by another daemon while we waited
            return ForeignHouse(final, key, tuple(sorted(integrity.verify(final).items())))
        return _build_new(root, key, final, package_wheel, requirements, target, platforms)


def _build_new(root: Path, key: str, final: Path, package_wheel: Path,
               requirements: list[str], target: RuntimeTarget,
               platforms: list[str]) -> ForeignHouse:
    abi = f"cp{target.python.replace('.', '')}"
    with tempfile.TemporaryDirectory(dir=root) as scratch:
        staging = Path(scratch)
        shutil.copy2(package_wheel, staging / package_wheel.name)
        # Resolved by uv for the node (pip's `download --python-version` would evaluate
        # markers for this interpreter: a 3.10 node would miss anyio's exceptiongroup), then
        # each pinned wheel fetched by pip for the node's Python, ABI and platforms.
        pins = _resolve(requirements, target)
        pip_run("download", "--no-deps", "--only-binary=:all:", "--python-version",
                target.python, "--implementation", "cp", "--abi", abi,
                *[arg for platform in platforms for arg in ("--platform", platform)],
                "--dest", str(staging), *pins,
                building=f"the runtime for {target.tag} nodes")
        for wheel in staging.glob("*.whl"):
            slimming = slim.slimming_for(wheel.name)
            if slimming is not None:
                slim.slim_wheel(wheel, slimming)
        digests = integrity.write_sums(staging)  # last: the build is complete
        os.chmod(staging, 0o755)
        try:
            staging.rename(final)
        except OSError:
            if not os.path.lexists(final):
                raise
            # Another daemon of this user built it meanwhile: theirs, checked as any.
            digests = integrity.verify(final)
        Path(scratch).mkdir()  # TemporaryDirectory wants something to remove
    logger.info("runtime built for another kind of node", key=key, path=str(final))
    return ForeignHouse(final, key, tuple(sorted(digests.items())))


def _resolve(requirements: list[str], target: RuntimeTarget) -> list[str]:
    """`requirements` and all they need on `target`, pinned (NAME==VERSION), by uv's
    resolver with the target's Python and platform (the package index, as pip uses it)."""
    from uv import find_uv_bin  # the daemon's own installer, at the version it ships

    done = subprocess.run(
        [find_uv_bin(), "pip", "compile", "--quiet", "--no-header", "--no-annotate",
         "--python-version", target.python, "--python-platform", uv_platform(target),
         "--only-binary", ":all:", "-"],
        input="\n".join(requirements) + "\n", capture_output=True, text=True,
        timeout=PIP_TIMEOUT_S, check=False)
    if done.returncode != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"resolving the runtime for {target.tag} nodes failed: {done.stderr.strip()[-800:]}",
            "the daemon needs the package index once per kind of node (uv reads UV_INDEX_URL "
            "and uv.toml for a mirror)")
    return [line.strip() for line in done.stdout.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]
