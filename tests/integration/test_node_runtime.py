"""The runtime on nodes that are not the daemon's kind (runtime/node_install.py), with real
Pythons (the machine image's pyenv 3.9 and 3.10), a real uv and the real package index:

- a node whose python3 is 3.10 (Ubuntu 22.04's minor) gets a runtime built for 3.10 from
  the index, never the daemon's own (3.11) wheels or archive, and the agent's code runs there;
- a node whose only Python is 3.9 (Debian 11's) gets a uv-managed CPython from the mirror
  configured (served on loopback: tests/python_mirror.py), then the daemon's own archive;
- with no mirror in reach, the launch fails naming what the node has and how to fix it.

Each node is a login directory here, its PATH holding only what the case says (and the
usual tools), reached through the runner launches use on local nodes.
"""

from __future__ import annotations

import os
import platform
import shutil
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.node_shared.node_commands import FreePortsRequest
from clusterd.runtime import node_helper
from clusterd.runtime.install import CURRENT_PYTHON, WheelhouseBuilder, linked_or_probed
from clusterd.runtime.node_install import install_runtime
from clusterd.runtime.node_platform import MANAGED_PYTHONS, PythonSource
from clusterd.runtime.runner import LocalRunner
from clusterd.runtime.venv_archive import PYTHON_TAG
from tests import python_mirror
from tests.support import short_tempdir

pytestmark = [pytest.mark.anyio, pytest.mark.ray]  # installs Ray into venvs: slow


@pytest.fixture(scope="module")
def root() -> Iterator[Path]:
    place = short_tempdir("cdnr-")
    try:
        WheelhouseBuilder(place / "wheelhouse").build()  # once for the module
        yield place / "wheelhouse"
    finally:
        shutil.rmtree(place, ignore_errors=True)


@pytest.fixture
def node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    home = tmp_path / "node"
    home.mkdir()
    monkeypatch.chdir(home)
    monkeypatch.setenv("HOME", str(home))
    return home


def pyenv(version: str) -> str:
    found = sorted(Path("/root/.pyenv/versions").glob(f"{version}.*/bin/python{version}"))
    assert found, f"no Python {version} in the machine image's pyenv"
    return str(found[-1])


def node_env(place: Path, python3: str | None) -> dict[str, str]:
    """A PATH with the system's tools but none of its Pythons; `python3` if given."""
    bin_dir = place / "node-bin"
    bin_dir.mkdir()
    if python3 is not None:
        (bin_dir / "python3").symlink_to(python3)
    for directory in ("/usr/local/bin", "/usr/bin", "/bin"):
        for tool in Path(directory).iterdir() if Path(directory).is_dir() else []:
            target = bin_dir / tool.name
            if (not tool.name.startswith("python") and not target.exists()
                    and os.access(tool, os.X_OK)):
                target.symlink_to(tool)
    return {**os.environ, "PATH": str(bin_dir)}


async def agent_answers(env: dict[str, str]) -> str:
    """The node helper (the agent's package) runs in the node's runtime; says its Python."""
    runner = LocalRunner(python=CURRENT_PYTHON, env=env)
    reply = await node_helper.call(runner, FreePortsRequest(count=2))
    assert len(reply.ports) == 2
    done = await anyio.run_process(
        [CURRENT_PYTHON, "-c", "import sys, clusterd.agent.main, clusterd.agent.node, ray; "
         "print('%d.%d' % sys.version_info[:2], sys._base_executable)"], env=env)
    return done.stdout.decode().strip()


async def test_a_node_with_python_310_gets_a_runtime_built_for_it(
        root: Path, node: Path, tmp_path: Path) -> None:
    env = node_env(tmp_path, pyenv("3.10"))
    builder = WheelhouseBuilder(root)
    await install_runtime(LocalRunner(env=env), builder)
    venvs = [p.name for p in (node / ".clusterd" / "venvs").iterdir()]
    [venv] = venvs
    glibc = (os.confstr("CS_GNU_LIBC_VERSION") or "").split()[-1]
    assert venv.endswith(f"-for-cp310-{platform.machine()}-glibc{glibc}"), venvs
    # Built from the index for 3.10: no wheel of the daemon's interpreter in it.
    house = root / venv
    wheels = [p.name for p in house.glob("*.whl")]
    assert any("cp310" in w for w in wheels), wheels
    assert not [w for w in wheels if "cp311" in w], wheels
    version, base = (await agent_answers(env)).split()
    assert version == "3.10" and Path(base).resolve() == Path(pyenv("3.10")).resolve()
    # Asked again, the node has it: linked, not probed.
    assert await linked_or_probed(LocalRunner(env=env), await builder.ensure()) is None


async def test_a_node_with_only_python_39_gets_a_uv_managed_python(
        root: Path, node: Path, tmp_path: Path) -> None:
    env = node_env(tmp_path, pyenv("3.9"))
    with python_mirror.serving() as downloads:
        builder = WheelhouseBuilder(root, PythonSource(downloads_json_url=downloads))
        await install_runtime(LocalRunner(env=env), builder)
    version, base = (await agent_answers(env)).split()
    assert version == PYTHON_TAG
    assert Path(base).resolve().is_relative_to((node / MANAGED_PYTHONS).resolve())
    # The Python clusterd installed is of the daemon's kind: it got the daemon's archive.
    wheelhouse = await builder.ensure()
    assert [p.name for p in (node / ".clusterd" / "venvs").iterdir()] == [wheelhouse.key]


async def test_a_node_with_no_python_and_no_mirror_in_reach_says_so(
        root: Path, node: Path, tmp_path: Path) -> None:
    env = node_env(tmp_path, pyenv("3.9"))
    builder = WheelhouseBuilder(root, PythonSource(
        downloads_json_url="http://127.0.0.1:9/downloads.json"))
    with pytest.raises(ProtocolError) as failed:
        await install_runtime(LocalRunner(env=env), builder)
    message, hint = failed.value.message, failed.value.hint or ""
    assert "has Python 3.9 (clusterd's runtime needs 3.10 or later)" in message, message
    assert f"installing a uv-managed Python {PYTHON_TAG} there failed" in message
    assert "CLUSTERD_PYTHON_MIRROR" in hint and "python3.10 or later" in hint
