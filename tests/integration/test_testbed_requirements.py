"""What the test beds install for themselves (scripts/_testbed/requirements.py): moto into a
venv that has none (as one made by scripts/quickstart), at pyproject's pin, with pip for real."""

from __future__ import annotations

import subprocess
import sys
import tomllib
import venv
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from _testbed import requirements  # noqa: E402


def test_the_moto_pin_is_pyprojects() -> None:
    dev = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"]["dev"]
    assert requirements.pinned("moto") in dev
    assert requirements.pinned("moto").startswith("moto[server]==")
    assert requirements.pinned("no-such-thing") == "no-such-thing"


def test_installed_packages_are_not_installed_again() -> None:
    assert requirements.installed("dpkg")
    assert not requirements.installed("no-such-package-clusterd")
    requirements.ensure_debian_packages(("dpkg", "coreutils"))  # no apt-get: nothing missing


@pytest.mark.timeout(600)
def test_a_venv_without_moto_gets_it(tmp_path: Path) -> None:
    venv.create(tmp_path / "venv", with_pip=True)
    python = str(tmp_path / "venv" / "bin" / "python")
    check = [python, "-c", "import moto.server, boto3; print(moto.__version__)"]
    assert subprocess.run(check, capture_output=True).returncode != 0
    requirements.ensure_venv_moto(python)
    done = subprocess.run(check, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert requirements.pinned("moto").endswith("==" + done.stdout.strip())
