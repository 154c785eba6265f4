"""The daemon's own SSH key pair (ssh/keys.py): made once, even when several launches (and both
cloud providers' instances of DaemonKey) ask for it at the same moment, and its public half is
always the private key's own: a mismatch makes every connection fail ("Public key mismatch")
or nodes refuse the key they were given."""

from __future__ import annotations

import concurrent.futures
import threading
from pathlib import Path

import asyncssh

from clusterd.ssh.keys import DaemonKey


def public_of(private: Path) -> str:
    return asyncssh.read_private_key(private).export_public_key().decode().strip()


def test_launches_at_once_get_one_key_pair_whose_halves_match(tmp_path: Path) -> None:
    directory = tmp_path / "ssh"
    keys = [DaemonKey(directory) for _ in range(2)]  # the aws and kubernetes providers'
    start = threading.Barrier(8)

    def ensure(n: int) -> str:
        start.wait()
        return keys[n % 2].ensure().public_openssh

    with concurrent.futures.ThreadPoolExecutor(8) as pool:
        publics = set(pool.map(ensure, range(8)))
    private = directory / "id_ed25519"
    assert publics == {public_of(private)}
    assert (directory / "id_ed25519.pub").read_text().strip() == public_of(private)
    assert sorted(p.name for p in directory.iterdir()) == [".lock", "id_ed25519",
                                                           "id_ed25519.pub"]
    assert private.stat().st_mode & 0o777 == 0o600


def test_a_public_half_that_does_not_match_is_written_again(tmp_path: Path) -> None:
    """A state left by an older daemon that raced (its .pub from another key): the private
    key is the truth."""
    directory = tmp_path / "ssh"
    first = DaemonKey(directory).ensure()
    other = asyncssh.generate_private_key("ssh-ed25519", comment="clusterd")
    (directory / "id_ed25519.pub").write_bytes(other.export_public_key())
    again = DaemonKey(directory).ensure()
    assert again.public_openssh == first.public_openssh == public_of(first.private_path)
    assert (directory / "id_ed25519.pub").read_text().strip() == first.public_openssh
