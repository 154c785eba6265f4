"""The script a node's python3 runs before anything is installed (runtime/install.py): it checks
every wheel against the daemon's digests and unpacks uv's binary from the bytes it checked,
whatever order the wheels' names sort in."""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from clusterd.runtime.install import _CHECK_AND_UNPACK, DIGESTS_DIFFER

INSTALLER = "uv-1.2.3-py3-none-manylinux_2_17_x86_64.whl"


def wheel(path: Path, members: dict[str, bytes]) -> str:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in members.items():
            archive.writestr(name, data)
    return hashlib.sha256(path.read_bytes()).hexdigest()


def run(house: Path, digests: dict[str, str], target: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-c", _CHECK_AND_UNPACK, str(house), INSTALLER,
                           str(target)], input=json.dumps(digests), capture_output=True,
                          text=True, timeout=60)


@pytest.mark.parametrize("others", [["aaa-1.0-py3-none-any.whl"],
                                    ["aaa-1.0-py3-none-any.whl", "zzz-1.0-py3-none-any.whl"]])
def test_uv_is_unpacked_from_its_checked_wheel(tmp_path: Path, others: list[str]) -> None:
    house = tmp_path / "house"
    house.mkdir()
    digests = {INSTALLER: wheel(house / INSTALLER, {"uv-1.2.3.data/scripts/uv": b"#!uv\n",
                                                    "uv-1.2.3.data/scripts/uvx": b"x"})}
    for name in others:
        digests[name] = wheel(house / name, {"pkg/__init__.py": b""})
    target = tmp_path / "uv"
    done = run(house, digests, target)
    assert done.returncode == 0, done.stderr
    assert target.read_bytes() == b"#!uv\n"
    assert target.stat().st_mode & 0o777 == 0o700


def test_a_wheel_that_differs_stops_everything_and_is_named(tmp_path: Path) -> None:
    house = tmp_path / "house"
    house.mkdir()
    digests = {INSTALLER: wheel(house / INSTALLER, {"uv-1.2.3.data/scripts/uv": b"#!uv\n"}),
               "zzz-1.0-py3-none-any.whl": "0" * 64}
    wheel(house / "zzz-1.0-py3-none-any.whl", {"pkg/__init__.py": b""})
    target = tmp_path / "uv"
    done = run(house, digests, target)
    assert done.returncode == DIGESTS_DIFFER
    assert done.stdout.strip() == "zzz-1.0-py3-none-any.whl"
    assert not target.exists()
