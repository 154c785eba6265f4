"""Generated code and unit files that ship with the project are what their sources say."""

from __future__ import annotations

import filecmp
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import needs_tool

ROOT = Path(__file__).resolve().parents[2]


def test_generated_protos_are_fresh(tmp_path: Path) -> None:
    env = {**os.environ, "PYTHON": str(Path(sys.executable))}
    subprocess.run([str(ROOT / "scripts" / "gen-protos"), str(tmp_path)], check=True, env=env)
    generated = tmp_path / "clusterd" / "agent" / "v1"
    committed = ROOT / "daemon" / "clusterd" / "agent" / "v1"
    names = ["agent_pb2.py", "agent_pb2.pyi", "agent_pb2_grpc.py"]
    _, mismatch, errors = filecmp.cmpfiles(generated, committed, names, shallow=False)
    assert not mismatch and not errors, (
        f"stale generated code: {mismatch + errors}; run scripts/gen-protos"
    )


def test_console_scripts_are_installed() -> None:
    bin_dir = Path(sys.executable).parent
    for name in ("clusterd", "clusterctl", "clusterd-agent"):
        assert (bin_dir / name).exists(), name


@pytest.mark.parametrize("unit", ["clusterd.service", "clusterd.socket"])
def test_systemd_units_verify(unit: str, tmp_path: Path) -> None:
    analyze = needs_tool("systemd-analyze", "systemd")
    # Verify a copy whose ExecStart points at this venv's clusterd, as the README's steps do.
    for name in ("clusterd.service", "clusterd.socket"):
        text = (ROOT / "systemd" / name).read_text()
        text = text.replace("%h/.local/bin/clusterd", str(Path(sys.executable).parent /
                                                           "clusterd"))
        (tmp_path / name).write_text(text)
    result = subprocess.run([analyze, "verify", str(tmp_path / unit)], capture_output=True,
                            text=True)
    # systemd-analyze exits 0 even for keys it ignores; any complaint at all is a failure.
    assert result.returncode == 0 and not result.stderr.strip(), result.stderr
