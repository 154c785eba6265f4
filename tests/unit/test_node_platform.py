"""What a node is (runtime/node_platform.py): the probe, as real shells and Pythons answer
it; the key a runtime is built and cached under; and which nodes may get the daemon's own
runtime archive (never one of another CPU, Python minor, or an older glibc)."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl.protocol import ProtocolError
from clusterd.runtime.node_platform import (
    NodePlatform,
    PythonSource,
    RuntimeTarget,
    daemon_target,
    matches_daemon,
    probe_script,
    uv_platform,
)


def probe(path: str, cwd: Path) -> NodePlatform:
    done = subprocess.run(["sh", "-c", probe_script()], env={**os.environ, "PATH": path},
                          cwd=cwd, capture_output=True, text=True, timeout=60, check=True)
    return NodePlatform.parse(done.stdout)


def _tools(tmp_path: Path) -> str:
    """sh, uname, getconf, grep... but no python of the system's."""
    tools = tmp_path / "tools"
    if tools.exists():
        return str(tools)
    tools.mkdir()
    for name in ("sh", "uname", "getconf", "grep", "zstd"):
        for directory in ("/usr/bin", "/bin"):
            if os.path.exists(f"{directory}/{name}"):
                (tools / name).symlink_to(f"{directory}/{name}")
                break
    return str(tools)


PYENV = "/root/.pyenv/versions"


def pyenv(version: str) -> str:
    found = sorted(Path(PYENV).glob(f"{version}.*/bin/python{version}"))
    assert found, f"no Python {version} under {PYENV} (the machine image's pyenv has it)"
    return str(found[-1])


def test_the_probe_finds_the_newest_usable_python_and_names_the_old_ones(
        tmp_path: Path) -> None:
    """python3 is 3.9 (Debian 11's), python3.10 is there too: 3.10 is taken, 3.9 named."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(pyenv("3.9"))
    (bin_dir / "python3.10").symlink_to(pyenv("3.10"))
    node = probe(f"{bin_dir}:{_tools(tmp_path)}", tmp_path)
    assert node.python == "3.10" and node.executable is not None
    assert Path(node.executable).resolve() == Path(pyenv("3.10")).resolve()
    assert [o.split()[0] for o in node.old] == ["3.9"]
    assert node.machine == platform.machine()
    assert node.glibc is not None and node.glibc >= (2, 17)
    assert node.has_zstd


def test_a_node_with_only_an_old_python_has_none_usable(tmp_path: Path) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(pyenv("3.9"))
    node = probe(f"{bin_dir}:{_tools(tmp_path)}", tmp_path)
    assert node.python is None and node.executable is None
    assert [o.split()[0] for o in node.old] == ["3.9"]
    nothing = probe(_tools(tmp_path), tmp_path)
    assert nothing.python is None and nothing.old == ()


def test_a_python_clusterd_installed_there_comes_first(tmp_path: Path) -> None:
    managed = tmp_path / ".clusterd" / "python" / "cpython-3.12.1-linux-x86_64-gnu" / "bin"
    managed.mkdir(parents=True)
    (managed / "python3").symlink_to(pyenv("3.12"))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "python3").symlink_to(pyenv("3.10"))
    node = probe(f"{bin_dir}:{_tools(tmp_path)}", tmp_path)
    assert node.python == "3.12"


def test_an_answer_that_is_not_the_probes_is_refused() -> None:
    with pytest.raises(ProtocolError, match="cannot tell what the node is"):
        NodePlatform.parse("sh: 1: uname: not found\n")


def test_parse_reads_every_field() -> None:
    node = NodePlatform.parse("machine aarch64\nzstd 0\nlibc glibc 2.35\n"
                              "old 3.8 /usr/bin/python3\npython 3.10 /opt/py 3/bin/python3\n")
    assert node == NodePlatform("aarch64", (2, 35), False, "3.10", "/opt/py 3/bin/python3",
                                ("3.8 /usr/bin/python3",))
    musl = NodePlatform.parse("machine x86_64\nzstd 1\nlibc unknown\npython none\n")
    assert musl.glibc is None and musl.python is None


def test_the_runtime_key_names_python_cpu_and_glibc_not_the_daemon() -> None:
    target = RuntimeTarget("3.10", "aarch64", (2, 35))
    assert target.tag == "cp310-aarch64-glibc2.35"
    assert target.tag != RuntimeTarget("3.10", "x86_64", (2, 35)).tag
    assert target.tag != RuntimeTarget("3.12", "aarch64", (2, 35)).tag
    assert target.tag != RuntimeTarget("3.10", "aarch64", (2, 31)).tag
    tags = target.platforms()
    assert tags[0] == "manylinux_2_35_aarch64" and "manylinux_2_17_aarch64" in tags
    assert "manylinux2014_aarch64" in tags and "manylinux_2_36_aarch64" not in tags
    assert not [t for t in tags if "x86_64" in t]


def test_a_node_without_glibc_is_refused_with_a_hint() -> None:
    with pytest.raises(ProtocolError, match="needs a glibc-based Linux node") as refused:
        RuntimeTarget("3.12", "x86_64", None).platforms()
    assert "Alpine" in (refused.value.hint or "")


def test_only_a_node_of_the_daemons_kind_gets_the_daemons_archive() -> None:
    daemon = RuntimeTarget("3.11", "x86_64", (2, 36))
    assert matches_daemon(RuntimeTarget("3.11", "x86_64", (2, 36)), daemon)
    assert matches_daemon(RuntimeTarget("3.11", "x86_64", (2, 39)), daemon)
    assert not matches_daemon(RuntimeTarget("3.11", "x86_64", (2, 35)), daemon)  # older
    assert not matches_daemon(RuntimeTarget("3.10", "x86_64", (2, 36)), daemon)
    assert not matches_daemon(RuntimeTarget("3.11", "aarch64", (2, 36)), daemon)
    assert not matches_daemon(RuntimeTarget("3.11", "x86_64", None), daemon)
    # A daemon on a Mac (no glibc target): no node gets its wheels.
    assert not matches_daemon(RuntimeTarget("3.11", "x86_64", (2, 36)), None)


def test_the_daemons_own_target_is_this_machine() -> None:
    own = daemon_target()
    assert own is not None and own.python == f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert own.machine == platform.machine() and own.glibc is not None


def test_the_python_source_is_passed_to_uv_as_configured() -> None:
    assert PythonSource().uv_args() == []
    assert PythonSource("http://m/", "http://m/d.json").uv_args() == [
        "--mirror", "http://m/", "--python-downloads-json-url", "http://m/d.json"]


def test_uvs_resolver_targets_the_newest_manylinux_the_nodes_glibc_meets() -> None:
    assert uv_platform(RuntimeTarget("3.10", "x86_64", (2, 35))) == "x86_64-manylinux_2_35"
    assert uv_platform(RuntimeTarget("3.10", "aarch64", (2, 30))) == "aarch64-manylinux_2_28"
    assert uv_platform(RuntimeTarget("3.12", "x86_64", (2, 41))) == "x86_64-manylinux_2_40"
    with pytest.raises(ProtocolError, match="older than any wheel"):
        uv_platform(RuntimeTarget("3.10", "x86_64", (2, 12)))


def test_a_tag_names_its_target_back() -> None:
    """`clusterd --prepare-runtime-for TAG` readies the runtime for nodes of that kind."""
    target = RuntimeTarget("3.13", "aarch64", (2, 41))
    assert RuntimeTarget.from_tag(target.tag) == target
    with pytest.raises(ProtocolError, match="names no kind of node"):
        RuntimeTarget.from_tag("py310-x86_64")
