"""Container jobs on a node (agent/node_tasks.py's script runner) with a real podman: the job's
script stays private to the node's user while the job runs, whatever user the image runs as,
and an image reference never reaches podman as an option."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from clusterd.agent import node_tasks
from tests.support import busybox_image, other_user, short_tempdir

TOOLS = ("sh", "cat", "echo", "sleep", "id")
ROOT_IMAGE = "localhost/clusterd-private:1"
NOBODY_IMAGE = "localhost/clusterd-private-nobody:1"


@pytest.fixture(scope="module")
def podman_env() -> Iterator[dict[str, str]]:
    with busybox_image(ROOT_IMAGE, TOOLS) as env, \
            busybox_image(NOBODY_IMAGE, TOOLS, changes=("USER 65534",)):
        yield env


@pytest.fixture
def workdir(podman_env: dict[str, str], monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    for name, value in podman_env.items():
        monkeypatch.setenv(name, value)  # the job's runtime reads it from the environment
    path = short_tempdir("cdjob-")
    path.chmod(0o755)  # an image's own user (65534) works in it too
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def outcome(steps: Iterator[tuple[str, Any]]) -> tuple[bytes, int | None]:
    output, code = b"", None
    for kind, value in steps:
        if kind == "output":
            output += value
        elif kind == "exit":
            code = value
    return output, code


@pytest.mark.parametrize("image", [ROOT_IMAGE, NOBODY_IMAGE])
def test_the_job_script_is_private_while_the_job_runs(workdir: Path, image: str) -> None:
    go = workdir / "go"
    script = (f'echo "$0"\nid -u\nwhile [ ! -e {go} ]; do sleep 0.1; done\n'
              'echo "read by the job"\n')
    with other_user() as attacker:
        steps = node_tasks._run_script(script, {}, str(workdir), image)
        try:
            kind, _ = next(steps)
            assert kind == "started"
            seen = b""
            while seen.count(b"\n") < 2:  # the script's path and the user it runs as
                kind, value = next(steps)
                assert kind == "output", (value, seen)
                seen += value
            path_text, uid = seen.decode().split()
            assert uid == ("0" if image == ROOT_IMAGE else "65534")
            # The container sees the script at the path it has on the node.
            path = Path(path_text)
            assert path.read_text() == script
            refused = attacker.run(["cat", str(path)])
            assert refused.returncode != 0 and "Permission denied" in refused.stderr
            holder = path.parent.stat()
            assert holder.st_uid == os.getuid() and holder.st_mode & 0o077 == 0
            go.touch()
            output, code = outcome(steps)
        finally:
            steps.close()
    assert (output, code) == (b"read by the job\n", 0)
    assert not path.exists() and not path.parent.exists()


def test_a_plain_job_script_is_private_too(workdir: Path) -> None:
    output, code = outcome(node_tasks._run_script(
        'stat -c "%a %U" "$(dirname "$0")" "$0"', {}, str(workdir)))
    assert code == 0
    holder, script = output.decode().splitlines()
    assert holder == "700 root" and script.split()[0] in ("600", "644")


def test_an_image_that_looks_like_an_option_never_reaches_podman(workdir: Path) -> None:
    """`docker:--cidfile=PATH` once had podman write PATH (and run the image `sh`)."""
    target = workdir / "cid"
    shell_env = {**os.environ}
    subprocess.run(["podman", "tag", ROOT_IMAGE, "localhost/sh:latest"], env=shell_env,
                   check=True, capture_output=True, timeout=60)
    try:
        output, code = outcome(node_tasks._run_script("echo ran", {}, str(workdir),
                                                      f"--cidfile={target}"))
    finally:
        subprocess.run(["podman", "untag", ROOT_IMAGE, "localhost/sh:latest"], env=shell_env,
                       capture_output=True, timeout=60)
    assert not target.exists()
    assert code != 0 and b"not an image reference" in output, output
