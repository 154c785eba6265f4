"""Host keys against a real SSH server (asyncssh's, on loopback): seeded from the user's
known_hosts (plain and @cert-authority lines), refused when they differ, refused when unknown
and the pool is strict, and announced with their fingerprint on first contact."""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path

import asyncssh
import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.ssh.connections import SSHConnections
from clusterd.ssh.host_keys import HostKeyStore, fingerprint

pytestmark = pytest.mark.anyio


class OpenServer(asyncssh.SSHServer):
    def begin_auth(self, username: str) -> bool:
        return False  # no authentication: only the host key is under test


class Host:
    def __init__(self, server: asyncssh.SSHAcceptor, key: asyncssh.SSHKey, port: int) -> None:
        self.server, self.key, self.port = server, key, port

    @property
    def target(self) -> SSHTarget:
        return SSHTarget("127.0.0.1", self.port, "someone")

    def known_hosts_line(self, key: asyncssh.SSHKey | None = None) -> str:
        public = (key or self.key).export_public_key("openssh").decode().strip()
        return f"[127.0.0.1]:{self.port} {public}\n"


async def _serve(host_key: asyncssh.SSHKey, certificate: object = None) -> Host:
    keys: object = [(host_key, certificate)] if certificate is not None else [host_key]
    server = await asyncssh.create_server(OpenServer, "127.0.0.1", 0, server_host_keys=keys)
    port = server.sockets[0].getsockname()[1]
    return Host(server, host_key, port)


@pytest.fixture
async def host() -> AsyncIterator[Host]:
    made = await _serve(asyncssh.generate_private_key("ssh-ed25519"))
    try:
        yield made
    finally:
        made.server.close()
        await made.server.wait_closed()


def connections(tmp_path: Path, announced: list[tuple[SSHTarget, str]]
                ) -> tuple[SSHConnections, HostKeyStore]:
    store = HostKeyStore(tmp_path / "pins", user_files=[tmp_path / "user_known_hosts"])

    async def on_new(target: SSHTarget, print_: str) -> bool:
        announced.append((target, print_))
        return False

    return SSHConnections(store, on_new_host_key=on_new), store


async def test_first_contact_pins_and_announces_the_fingerprint(host: Host,
                                                                tmp_path: Path) -> None:
    announced: list[tuple[SSHTarget, str]] = []
    ssh, store = connections(tmp_path, announced)
    try:
        node = await ssh.get(host.target)
        assert node.first_contact and node.host_key == fingerprint(host.key)
        assert node.host_key.startswith("ssh-ed25519 SHA256:")
        assert announced == [(host.target, fingerprint(host.key))]
        assert [k.get_fingerprint() for k in store.pinned("127.0.0.1", host.port)] == [
            host.key.get_fingerprint()]
        await ssh.forget([host.target])
        again = await ssh.get(host.target)
        assert not again.first_contact and len(announced) == 1  # pinned: nothing new
    finally:
        await ssh.close_all()


async def test_keys_in_the_users_known_hosts_are_used(host: Host, tmp_path: Path) -> None:
    announced: list[tuple[SSHTarget, str]] = []
    ssh, _ = connections(tmp_path, announced)
    (tmp_path / "user_known_hosts").write_text(host.known_hosts_line())
    try:
        node = await ssh.get(host.target)
        assert not node.first_contact and announced == []
    finally:
        await ssh.close_all()


async def test_a_key_other_than_the_users_known_hosts_is_refused(host: Host,
                                                                 tmp_path: Path) -> None:
    ssh, store = connections(tmp_path, [])
    other = asyncssh.generate_private_key("ssh-ed25519")
    (tmp_path / "user_known_hosts").write_text(host.known_hosts_line(other))
    try:
        with pytest.raises(ProtocolError) as error:
            await ssh.get(host.target)
        assert error.value.code == ErrorCode.HOST_KEY_MISMATCH
        assert "known_hosts" in error.value.message
        assert host.key.get_fingerprint() in error.value.message  # what it offered instead
        assert store.pinned("127.0.0.1", host.port) == []
    finally:
        await ssh.close_all()


async def test_strict_pools_refuse_unknown_keys(host: Host, tmp_path: Path) -> None:
    announced: list[tuple[SSHTarget, str]] = []
    ssh, store = connections(tmp_path, announced)
    strict = SSHTarget("127.0.0.1", host.port, "someone", strict_host_keys=True)
    try:
        with pytest.raises(ProtocolError) as error:
            await ssh.get(strict)
        assert error.value.code == ErrorCode.HOST_KEY_UNKNOWN
        assert host.key.get_fingerprint() in error.value.message
        assert "ssh-keyscan" in error.value.hint
        assert store.pinned("127.0.0.1", host.port) == [] and announced == []
        (tmp_path / "user_known_hosts").write_text(host.known_hosts_line())
        node = await ssh.get(strict)
        assert not node.first_contact
    finally:
        await ssh.close_all()


async def test_certificates_signed_by_a_trusted_authority(tmp_path: Path) -> None:
    authority = asyncssh.generate_private_key("ssh-ed25519")
    host_key = asyncssh.generate_private_key("ssh-ed25519")
    certificate = authority.generate_host_certificate(host_key, "h", principals=["127.0.0.1"])
    host = await _serve(host_key, certificate)
    announced: list[tuple[SSHTarget, str]] = []
    ssh, store = connections(tmp_path, announced)
    ca = authority.export_public_key("openssh").decode().strip()
    try:
        (tmp_path / "user_known_hosts").write_text(
            f"@cert-authority [127.0.0.1]:{host.port} {ca}\n")
        node = await ssh.get(host.target)
        assert not node.first_contact and announced == []
        assert store.pinned("127.0.0.1", host.port) == []  # a certificate is not pinned
        await ssh.forget([host.target])
        stranger = asyncssh.generate_private_key("ssh-ed25519").export_public_key(
            "openssh").decode().strip()
        (tmp_path / "user_known_hosts").write_text(
            f"@cert-authority [127.0.0.1]:{host.port} {stranger}\n")
        with pytest.raises(ProtocolError) as error:
            await ssh.get(host.target)
        assert error.value.code == ErrorCode.HOST_KEY_MISMATCH
    finally:
        await ssh.close_all()
        host.server.close()
        await host.server.wait_closed()


async def test_cloud_instances_are_forgotten_with_their_cluster(host: Host,
                                                                tmp_path: Path) -> None:
    ssh, store = connections(tmp_path, [])
    instance = SSHTarget("127.0.0.1", host.port, "someone", host_key_alias="i-0123456789")
    try:
        await ssh.get(instance)
        assert store.pinned("i-0123456789", host.port)
        await ssh.forget([instance])
        assert store.pinned("i-0123456789", host.port) == []
        assert (tmp_path / "pins").stat().st_mode & 0o777 == 0o600
    finally:
        await ssh.close_all()
