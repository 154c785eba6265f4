"""What a failed agent start says (agent/node.py start_agent): when the head's Ray died under
it, Ray's own log, not the agent's crash. The agent here is the real one, failing at once on a
log level it does not know; Ray's run dir is as `start_ray` leaves it."""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from clusterd.agent import node, node_spawn
from clusterd.node_shared.auth import new_token
from clusterd.node_shared.node_commands import StartAgentRequest
from tests.support import short_tempdir


@pytest.fixture
def root() -> Iterator[Path]:
    path = short_tempdir("cdaf-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def failing_agent(root: Path, ray_run: Path) -> dict[str, object]:
    return {"dir": str(root / "agent-run"), "listen": f"unix:{root}/agent.sock",
            "state_dir": str(root / "state"), "ray_address": "127.0.0.1:1",
            "cluster_name": "c", "token": new_token(), "log_level": "not-a-level",
            "node_run_dir": str(ray_run), "timeout": 30}


def ray_run_dir(root: Path, pid: int) -> Path:
    run = root / "ray-run"
    run.mkdir()
    (run / "ray.log").write_text("raylet: object store of 1 MB is too small\n"
                                 "Some Ray subprocesses exited unexpectedly\n")
    (run / "ray.pid").write_text(json.dumps({"pid": pid, "create_time": 0}))
    return run


def test_an_agent_failing_because_ray_died_says_what_rays_log_says(root: Path) -> None:
    gone = subprocess.Popen(["true"])
    gone.wait()
    run = ray_run_dir(root, gone.pid)
    with pytest.raises(node.HelperError) as failure:
        node.start_agent(StartAgentRequest.from_dict(failing_agent(root, run)))
    message = str(failure.value)
    assert message.startswith("Ray head exited while the agent was starting")
    assert "object store of 1 MB is too small" in message


def test_an_agent_failing_on_its_own_says_its_own_error(root: Path) -> None:
    alive = subprocess.Popen(["sleep", "60"])
    try:
        run = root / "ray-run"
        run.mkdir()
        (run / "ray.log").write_text("Ray runtime started.\n")
        node_spawn.write_pidfile(run / "ray.pid", alive.pid)
        with pytest.raises(node.HelperError) as failure:
            node.start_agent(StartAgentRequest.from_dict(failing_agent(root, run)))
        assert str(failure.value).startswith("clusterd-agent exited while starting")
        assert "not-a-level" in str(failure.value)
    finally:
        alive.kill()
        alive.wait()
