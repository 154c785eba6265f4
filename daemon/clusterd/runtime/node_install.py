"""The runtime onto one node, whatever the node is: planned from one probe, then installed.

- A node of the daemon's kind (Python minor, CPU, glibc at least the daemon's) gets the
  daemon's runtime archive streamed (install.py, venv_archive.py): the fast path.
- Any other node with a Python of node_platform.MIN_PYTHON or later gets a wheelhouse built
  for it (foreign_house.py), copied (rsync), and installed by uv (sent as a static binary,
  checked by its digest): `uv venv` for the node's Python (no venv module needed: Ubuntu's
  python3 has none without python3-venv), then every wheel offline, each checked against the
  digests held in the daemon's memory (`--require-hashes`). The node needs no package index.
- A node with no usable Python (none, only an older one, such as Debian 11's 3.9) first gets
  a uv-managed CPython of the daemon's minor in ~/.clusterd/python (`uv python install`, from
  python-build-standalone's releases or the mirror configured: node_platform.PythonSource),
  then the fast path where its CPU and glibc allow it.
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd import log
from clusterd.runtime import install, node_binary
from clusterd.runtime.foreign_house import ForeignHouse
from clusterd.runtime.install import READY_MARKER, Wheelhouse, WheelhouseBuilder
from clusterd.runtime.node_platform import MANAGED_PYTHONS, MIN_PYTHON, NodePlatform
from clusterd.runtime.runner import CommandRunner
from clusterd.runtime.venv_archive import PYTHON_TAG

logger = log.get("clusterd.install")

# (phase, message): what a launch's progress shows.
Say = Callable[[str, str], Awaitable[None]]
PYTHON_INSTALL_TIMEOUT_S = 900  # a CPython download (30 MB) and unpacking, on a slow link
UV_INSTALL_TIMEOUT_S = 1800


@dataclasses.dataclass(frozen=True)
class NodePlan:
    """How one node gets the runtime: the daemon's `archive`, or `foreign`, a wheelhouse
    built for it, installed with `uv` (a local binary for the node's CPU)."""

    node: NodePlatform
    archive: str | None
    foreign: ForeignHouse | None = None
    uv: Path | None = None


async def _quiet(phase: str, message: str) -> None:
    pass


async def plan_node(runner: CommandRunner, builder: WheelhouseBuilder, wheelhouse: Wheelhouse,
                    force: bool = False, say: Say = _quiet) -> NodePlan | None:
    """None if the node has this runtime already (and not `force`); it is then the current
    one. Else the plan for it, with whatever it needs built here (and a CPython installed
    there if it has no usable Python)."""
    node = await install.linked_or_probed(runner, wheelhouse, force)
    if node is None:
        return None
    if node.python is None:
        await say("python", f"installing Python {PYTHON_TAG} (uv-managed) on nodes with no "
                            f"Python {MIN_PYTHON[0]}.{MIN_PYTHON[1]}+")
        await install_python(runner, await builder.node_uv(node.machine),
                             builder.python_source.uv_args(), node)
        node = await install.linked_or_probed(runner, wheelhouse, force=True)
        assert node is not None
        if node.python is None:
            raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                                f"{runner.node_name}: the Python uv installed in "
                                f"~/{MANAGED_PYTHONS} does not run")
    archive = install.archive_for(node)
    if archive is not None:
        return NodePlan(node, archive)
    target = node.target()
    await say("build", f"preparing the runtime for {target.tag} nodes (the first time: "
                       "fetched from the package index, minutes)")
    house = await builder.foreign(wheelhouse, target)
    return NodePlan(node, None, house, await builder.node_uv(node.machine))


def verify_plans(wheelhouse: Wheelhouse, plans: list[NodePlan]) -> None:
    """Blocking: what the nodes are to get is still what was verified when built."""
    wheelhouse.verify([p.archive for p in plans if p.archive is not None])
    for house in {p.foreign.key: p.foreign for p in plans if p.foreign is not None}.values():
        house.verify()


async def install_planned(runner: CommandRunner, wheelhouse: Wheelhouse, plan: NodePlan,
                          announce: Callable[[str], Awaitable[None]] | None = None,
                          behind_head: bool = False,
                          sent: Callable[[], None] | None = None) -> None:
    """Install the runtime as planned (from files the caller has verified) and make it the
    current one. `announce` hears each phase ("copy", "install") as it begins; `sent` is
    called once nothing more goes from here to the node."""
    if plan.archive is not None:
        if announce is not None:
            await announce("install")
        await install.receive_archive(runner, wheelhouse, plan.node, behind_head)
        if sent is not None:
            sent()
        return
    assert plan.foreign is not None and plan.uv is not None
    assert plan.node.executable is not None
    if announce is not None:
        await announce("copy")
    uv = _uv_on_node()
    await node_binary.send_binary(runner, plan.uv, uv)
    await runner.sync_dir(str(plan.foreign.path),
                          f"~/{install.remote_house(plan.foreign.key)}", timeout_s=900)
    if sent is not None:
        sent()
    if announce is not None:
        await announce("install")
    await _install_foreign(runner, plan.foreign, uv, plan.node.executable)


def _uv_on_node() -> str:
    return f".clusterd/bin/uv-{importlib.metadata.version(install.INSTALLER_DISTRIBUTION)}"


def _uv(uv: str, cache: str | None) -> list[str]:
    # uv is told everything (no config files, no interpreter downloads, no index): what it
    # does is what is written here.
    return [uv, "--quiet", "--no-config", "--offline", "--no-python-downloads",
            *(["--cache-dir", cache] if cache else ["--no-cache"])]


async def _install_foreign(runner: CommandRunner, house: ForeignHouse, uv: str,
                           executable: str) -> None:
    """A venv for the node's Python (`executable`), with every wheel of the copied `house`,
    each checked against the digests in our memory; the ready marker last."""
    venv, remote = f".clusterd/venvs/{house.key}", install.remote_house(house.key)
    started = time.monotonic()
    hashes = f"{remote}.require-hashes.txt"
    written = await runner.run(["sh", "-c", 'cat > "$1"', "sh", hashes],
                               input=house.require_hashes().encode(), timeout_s=60)
    if written.exit_code != 0:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{runner.node_name}: writing {hashes}: {written.error_tail(3)}")
    # Its cache beside the venv, on the same mount: the venv's files are hard links to it,
    # not copies, and it goes once the install is done.
    cache = f"{remote}.uv-cache"
    try:
        steps = [("creating the venv", [*_uv(uv, cache), "venv", "--clear", "--python",
                                        executable, venv]),
                 ("installing the wheels", [
                     *_uv(uv, cache), "pip", "install", "--python", f"{venv}/bin/python",
                     "--no-index", "--no-deps", "--require-hashes", "--find-links", remote,
                     "-r", hashes])]
        for what, args in steps:
            done = await runner.run(args, timeout_s=UV_INSTALL_TIMEOUT_S)
            if done.exit_code != 0:
                raise ProtocolError(
                    ErrorCode.PROVIDER_ERROR,
                    f"installing the runtime on {runner.node_name} failed ({what}): "
                    f"{done.error_tail(12)}",
                    "a hash mismatch means the copy on the node changed: remove "
                    f"~/{remote} there and launch again")
    finally:
        await runner.run(["rm", "-rf", cache], timeout_s=300)
    await runner.run(["touch", f"{venv}/{READY_MARKER}"], timeout_s=60)
    await install.link_current(runner, house.key)
    logger.info("runtime installed", node=runner.node_name, key=house.key, archive=None,
                seconds=round(time.monotonic() - started, 2))


async def install_python(runner: CommandRunner, uv_binary: Path, source_args: list[str],
                         node: NodePlatform) -> None:
    """A uv-managed CPython of the daemon's minor in the node's ~/.clusterd/python."""
    uv = _uv_on_node()
    await node_binary.send_binary(runner, uv_binary, uv)
    started = time.monotonic()
    done = await runner.run(
        [uv, "--quiet", "--no-config", "--no-cache", "python", "install", PYTHON_TAG,
         "--install-dir", MANAGED_PYTHONS, "--no-bin", *source_args],
        timeout_s=PYTHON_INSTALL_TIMEOUT_S)
    if done.exit_code != 0:
        had = (", ".join(f"Python {old.split()[0]}" for old in node.old) or "no Python")
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"{runner.node_name} has {had} (clusterd's runtime needs "
            f"{MIN_PYTHON[0]}.{MIN_PYTHON[1]} or later), and installing a uv-managed "
            f"Python {PYTHON_TAG} there failed: {done.error_tail(6)}",
            "let the node reach python-build-standalone's downloads (uv's default: "
            "releases.astral.sh, GitHub), or set "
            "CLUSTERD_PYTHON_MIRROR (or CLUSTERD_PYTHON_DOWNLOADS_JSON_URL) to a mirror it "
            "reaches; or install python3.10 or later on the image")
    logger.info("python installed", node=runner.node_name, version=PYTHON_TAG,
                seconds=round(time.monotonic() - started, 2))


async def install_runtime(runner: CommandRunner, builder: WheelhouseBuilder,
                          force: bool = False) -> None:
    """Make sure the node has this runtime and `.clusterd/current` points at it; with
    `force`, install it again even if it claims to be there (it answered with another
    version). The steps one by one (a launch runs them node by node: install_round.py)."""
    wheelhouse = await builder.ensure()
    plan = await plan_node(runner, builder, wheelhouse, force)
    if plan is not None:
        # Our copy first: changed since it was checked (or built), it goes nowhere.
        await anyio.to_thread.run_sync(verify_plans, wheelhouse, [plan])
        await install_planned(runner, wheelhouse, plan)
