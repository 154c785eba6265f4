"""Host keys pinned on first contact, in an OpenSSH known_hosts file of the daemon's own.

The first connection to a host records its key; later connections accept only that key (the
SSH handshake itself checks it, before any authentication). `ssh CLUSTER` uses the same file,
so OpenSSH checks the same pins.
"""

from __future__ import annotations

import os
from pathlib import Path

import asyncssh


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


class HostKeyStore:
    def __init__(self, path: Path) -> None:
        self.path = path

    def _lines(self) -> list[str]:
        try:
            return self.path.read_text().splitlines()
        except FileNotFoundError:
            return []

    def pinned(self, host: str, port: int) -> list[asyncssh.SSHKey]:
        pattern = host_pattern(host, port)
        keys = []
        for line in self._lines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == pattern:
                keys.append(asyncssh.import_public_key(f"{parts[1]} {parts[2]}"))
        return keys

    def pin(self, host: str, port: int, key: asyncssh.SSHKey) -> None:
        entry = f"{host_pattern(host, port)} {key.export_public_key('openssh').decode().strip()}"
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(entry + "\n")

    def forget(self, host: str, port: int) -> None:
        pattern = host_pattern(host, port)
        kept = [line for line in self._lines() if line.split()[:1] != [pattern]]
        self.path.write_text("".join(f"{line}\n" for line in kept))
