"""A real two-node Ray cluster (two raylets, on 127.0.0.2 and 127.0.0.3) with the agent on
its head, started by the node helper as the daemon starts them; and the calls the agent's
tests share."""

from __future__ import annotations

import dataclasses
import os
import secrets
import shutil
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from clusterctl.protocol import JobStatus
from clusterd.agent import node
from clusterd.node_shared.auth import new_token
from clusterd.runtime.agent_client import AgentClient
from clusterd.runtime.agent_types import Job, JobSpec, NodeResources
from tests.support import short_tempdir, wait_for


@dataclasses.dataclass
class AgentCluster:
    root: Path
    endpoint: str
    head_run: Path
    agent_params: dict[str, object]
    token: str

    def path(self, name: str) -> Path:
        return self.root / "work" / name


def helper(command: str, params: dict[str, Any]) -> dict[str, Any]:
    """A node helper command, as `python -m clusterd.agent.node` runs it: its typed request
    read from the plain object, its typed reply written back as one."""
    return node.COMMANDS[command](params)


@pytest.fixture(scope="module")
def agent_cluster() -> Iterator[AgentCluster]:
    root = short_tempdir("cda-")
    token = root / "token"
    helper("write-private", {"path": str(token), "token": secrets.token_hex(16)})
    env = {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": str(token)}
    gcs, client_port, dash_port, metric1, metric2 = helper("free-ports", {"count": 5})["ports"]
    env.update(AUTOSCALER_METRIC_PORT=str(metric1), DASHBOARD_METRIC_PORT=str(metric2))
    key = root.name
    common = {"num_cpus": 2, "object_store_bytes": 80 * 1024 * 1024, "env": env,
              "ports": {"min_worker_port": 0, "max_worker_port": 0}, "timeout": 60}
    head_run, worker_run = root / "head" / "run", root / "worker" / "run"
    try:
        helper("start-ray", {**common, "dir": str(head_run), "temp_key": f"{key}h", "head": True,
                        "node_ip": "127.0.0.2", "gcs_port": gcs,
                        "ports": {**common["ports"], "ray_client_server_port": client_port,
                                  "dashboard_port": dash_port}})
        helper("start-ray", {**common, "dir": str(worker_run), "temp_key": f"{key}w", "head": False,
                        "node_ip": "127.0.0.3", "head_address": f"127.0.0.2:{gcs}"})
        agent_token = new_token()
        agent_params = {"dir": str(head_run), "listen": f"unix:{root}/s/agent.sock",
                        "state_dir": str(root / "head" / "agent"),
                        "ray_address": f"127.0.0.2:{gcs}", "cluster_name": "two",
                        "env": env, "timeout": 90, "token": agent_token}
        started = helper("start-agent", agent_params)
        assert started["socket"] == f"{root}/s/agent.sock"
        (root / "work").mkdir()
        cluster = AgentCluster(root, f"unix:{root}/s/agent.sock", head_run, agent_params,
                               agent_token)

        async def two_nodes() -> bool:
            client = AgentClient("two", cluster.endpoint, agent_token)
            try:
                return (await client.health()).ray_nodes_alive == 2
            finally:
                await client.close()

        wait_for(lambda: anyio.run(two_nodes), 60, "both Ray nodes to join", interval=0.5)
        yield cluster
    finally:
        helper("stop", {"dir": str(head_run), "parts": ["agent"]})
        helper("stop", {"dir": str(worker_run)})  # workers before the head, as the daemon does
        helper("stop", {"dir": str(head_run)})
        if not os.environ.get("CLUSTERD_TEST_KEEP"):  # keep everything to debug a failure
            helper("cleanup", {"paths": [], "ray_temp_keys": [f"{key}h", f"{key}w"]})
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
async def agent(agent_cluster: AgentCluster) -> AsyncIterator[AgentClient]:
    client = AgentClient("two", agent_cluster.endpoint, agent_cluster.token)
    try:
        yield client
    finally:
        await client.close()


def spec(run: str, *, nodes: int = 2, cpus: float = 0.5, setup: str = "",
         envs: dict[str, str] | None = None, secrets_: dict[str, str] | None = None,
         workdir: str = "") -> JobSpec:
    return JobSpec(name="t", run=run, setup=setup, num_nodes=nodes,
                   resources=NodeResources(cpus=cpus), envs=envs or {},
                   secrets=secrets_ or {}, workdir=workdir, cluster_name="two")


async def run_to_end(agent: AgentClient, job: JobSpec) -> tuple[Job, bytes]:
    reply = await agent.add_job(job)
    log = b""
    with anyio.fail_after(120):
        async for message in agent.tail(reply.job_id, follow=True, tail_lines=0, offset=0):
            log += message.data
    (final,) = await agent.jobs([reply.job_id])
    # The stream's last message says why, as the queue does: exec needs no call after it.
    assert message.final and message.status == final.status
    assert message.failure_reason == final.failure_reason
    return final, log


async def wait_status(agent: AgentClient, job_id: int, wanted: set[JobStatus],
                      timeout: float = 60) -> Job:
    with anyio.fail_after(timeout):
        while True:
            (job,) = await agent.jobs([job_id])
            if job.status in wanted:
                return job
            await anyio.sleep(0.05)


async def wait_file(path: Path, timeout: float = 60) -> str:
    with anyio.fail_after(timeout):
        while not path.exists() or not path.read_text().strip():
            await anyio.sleep(0.05)
    return path.read_text().strip()
