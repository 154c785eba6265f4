"""The daemon's own view of its connections to nodes (SSHConnections.link) and what a
controller makes of it (control.NodeLinks), against an in-process asyncssh server whose
side of a connection can fall silent, as a partitioned node's does."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import asyncssh
import pytest

from clusterd.control import NodeLinks
from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import LinkState, SSHConnections
from clusterd.ssh.host_keys import HostKeyStore

pytestmark = pytest.mark.anyio


class Node(asyncssh.SSHServer):
    """Lets anyone in, and remembers its connections so a test can silence them."""

    connections: list[asyncssh.SSHServerConnection] = []

    def connection_made(self, conn: asyncssh.SSHServerConnection) -> None:
        Node.connections.append(conn)

    def begin_auth(self, username: str) -> bool:
        return False  # no authentication needed


class FakeNode:
    def __init__(self, tmp_path: Path) -> None:
        self.key = asyncssh.generate_private_key("ssh-ed25519")
        self.client_key = tmp_path / "id"
        asyncssh.generate_private_key("ssh-ed25519").write_private_key(self.client_key)
        self.server: Any = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        Node.connections = []
        self.server = await asyncssh.create_server(Node, "127.0.0.1", port,
                                                   server_host_keys=[self.key])
        self.port = self.server.sockets[0].getsockname()[1]

    def stop_listening(self) -> None:
        self.server.close()

    def fall_silent(self) -> None:
        """Read nothing more from the daemon (its keepalives go unanswered)."""
        # asyncssh offers no public way to stop a side from reading: its transport's.
        for conn in Node.connections:
            transport = conn._transport
            assert transport is not None
            transport.pause_reading()

    @property
    def target(self) -> SSHTarget:
        return SSHTarget("127.0.0.1", self.port, "me", str(self.client_key))


@pytest.fixture
async def node(tmp_path: Path) -> AsyncIterator[FakeNode]:
    fake = FakeNode(tmp_path)
    await fake.start()
    yield fake
    fake.stop_listening()
    for conn in Node.connections:
        conn.abort()


async def lost(pool: SSHConnections, target: SSHTarget) -> None:
    with anyio.fail_after(5):
        while pool.link(target).state != LinkState.LOST:
            await anyio.sleep(0.01)


async def test_a_node_that_falls_silent_is_lost_by_keepalive(node: FakeNode,
                                                             tmp_path: Path) -> None:
    pool = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    assert pool.link(node.target).state == LinkState.NONE
    await pool.get(node.target)
    assert pool.link(node.target).state == LinkState.UP
    pool.watch(node.target, 0.05, 2)  # tightened on the live connection
    node.fall_silent()
    await lost(pool, node.target)
    link = pool.link(node.target)
    assert link.silent and "keepalive" in link.reason
    await pool.get(node.target)  # it answers again: a new connection, the loss forgotten
    assert pool.link(node.target).state == LinkState.UP
    await pool.close_all()


async def test_a_connection_the_daemon_closes_is_no_loss(node: FakeNode,
                                                         tmp_path: Path) -> None:
    pool = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    await pool.get(node.target)
    await pool.drop(node.target)
    assert pool.link(node.target).state == LinkState.NONE


async def test_a_silent_node_that_cannot_be_reached_again_is_cut_off(
        node: FakeNode, tmp_path: Path) -> None:
    pool = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    links = NodeLinks(pool, probe_s=2)
    assert await links.cut_off([node.target]) is None  # connected, and watched from now
    pool.watch(node.target, 0.05, 2)  # (tighter than NodeLinks' own, for the test's sake)
    node.fall_silent()
    node.stop_listening()
    await lost(pool, node.target)
    why = await links.cut_off([node.target])
    assert why is not None and "stopped answering the daemon's SSH keepalives" in why
    await pool.close_all()


async def test_a_silent_node_that_answers_a_new_connection_is_not_cut_off(
        node: FakeNode, tmp_path: Path) -> None:
    # A daemon that was suspended, a connection reset: the node is fine.
    pool = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    links = NodeLinks(pool, probe_s=2)
    assert await links.cut_off([node.target]) is None
    pool.watch(node.target, 0.05, 2)
    node.fall_silent()
    await lost(pool, node.target)
    assert await links.cut_off([node.target]) is None
    assert pool.link(node.target).state == LinkState.UP
    await pool.close_all()


async def test_a_node_never_reached_is_no_evidence(tmp_path: Path) -> None:
    pool = SSHConnections(HostKeyStore(tmp_path / "known_hosts"))
    nowhere = SSHTarget("127.0.0.1", 9, "me")  # the discard port: nothing listens
    assert await NodeLinks(pool, probe_s=2).cut_off([nowhere]) is None
