"""Commands the daemon runs on a node over SSH, on the ssh test bed (one real sshd host):
one it stops waiting for is stopped on the node too."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

from clusterd.providers.base import SSHTarget
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore
from tests.e2e.sshbed import Bed, ssh_bed

pytestmark = pytest.mark.ray


@pytest.fixture(scope="module")
def bed() -> Iterator[Bed]:
    with ssh_bed(count=1) as made:
        yield made


@pytest.mark.anyio
async def test_a_remote_command_given_up_on_stops_on_the_node(bed: Bed, tmp_path: Path) -> None:
    """A command the daemon stops waiting for (cancelled: a launch called off) does not go on
    running on the node: its process group gets SIGTERM and its channel is closed."""
    host = bed.hosts[0]
    target = SSHTarget(host["ip"], host["port"], host["user"], bed.key)
    connections = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))

    async def running() -> list[str]:  # the commands the user runs, but its sshd
        listed = await anyio.run_process(["ps", "-o", "comm=", "-u", host["user"]],
                                         check=False)
        return [c for c in listed.stdout.decode().split() if c != "sshd"]

    try:
        async with anyio.create_task_group() as group:
            group.start_soon(connections.run, target, "sleep 300 & sleep 301; wait")
            with anyio.fail_after(30):
                while (await running()).count("sleep") < 2:
                    await anyio.sleep(0.05)
            group.cancel_scope.cancel()
        with anyio.fail_after(10):
            while await running():
                await anyio.sleep(0.1)
    finally:
        await connections.close_all()
