"""A managed job on a `local` cluster whose agent stops answering for a while (SIGSTOP): a
refresh then finds the cluster INIT, and that alone must not cost the job its attempt."""

from __future__ import annotations

import json
import os
import re
import signal
from collections.abc import Iterator

import pytest

from tests.e2e.test_managed_job_views import managed_daemon
from tests.e2e.test_managed_jobs import FINAL, job, wait_status
from tests.support import Daemon, wait_for


@pytest.fixture
def daemon() -> Iterator[Daemon]:
    with managed_daemon("cdms-") as d:
        yield d


def test_an_agent_slow_to_answer_a_refresh_costs_the_job_no_attempt(daemon: Daemon) -> None:
    go = daemon.root / "go"
    (daemon.root / "patient.yaml").write_text(
        f"name: patient\nresources:\n  cpus: 1\nrun: |\n  echo begun\n"
        f"  while [ ! -e {go} ]; do sleep 0.2; done\n  echo ended\n")
    launched = daemon.ctl("jobs", "launch", "-d", "--infra", "local", "patient.yaml")
    assert launched.returncode == 0, launched.stderr
    found = re.search(r"Managed job (\d+) submitted", launched.stderr)
    assert found, launched.stderr
    job_id = int(found.group(1))
    running = wait_status(daemon, job_id, {"RUNNING"} | FINAL, 240)
    assert running["status"] == "RUNNING", running
    cluster = daemon.cluster(running["cluster"])
    assert cluster is not None
    run_dir = daemon.state_dir / "local" / str(cluster["cloud_name"]) / "run"
    agent_pid = json.loads((run_dir / "agent.pid").read_text())["pid"]

    os.kill(agent_pid, signal.SIGSTOP)
    try:
        refreshed = daemon.ctl("status", "--refresh", "--json", timeout=120)
        assert refreshed.returncode == 0, refreshed.stderr
        (seen,) = [c for c in json.loads(refreshed.stdout) if c["name"] == cluster["name"]]
        assert seen["status"] == "INIT", seen

        # The controller looks at the cluster (every 3 s) while its agent is still silent.
        def looked_or_gave_up() -> bool:
            view = daemon.ctl("jobs", "logs", str(job_id), "--controller", "--no-follow")
            return ("the job's cluster is INIT" in view.stdout
                    or job(daemon, job_id)["status"] != "RUNNING")

        wait_for(looked_or_gave_up, 60, "the controller to look at the INIT cluster",
                 interval=0.5)
        assert job(daemon, job_id)["status"] == "RUNNING", daemon.log()[-4000:]
    finally:
        os.kill(agent_pid, signal.SIGCONT)
    go.touch()
    done = wait_status(daemon, job_id, FINAL, 180)
    assert done["status"] == "SUCCEEDED", (done, daemon.log()[-4000:])
    assert (done["attempts"], done["recoveries"]) == (1, 0), (done, daemon.log()[-6000:])
    logs = daemon.ctl("jobs", "logs", str(job_id), "--no-follow").stdout
    assert logs.count("begun") == 1 and logs.count("ended") == 1, logs
