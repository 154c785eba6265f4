"""Host keys: pinned on first contact in an OpenSSH known_hosts file of the daemon's own, and
seeded from the user's (`~/.ssh/known_hosts`, `/etc/ssh/ssh_known_hosts`, `@cert-authority`
lines included).

A host the user's files know is checked against them (its key, or a certificate signed by a
CA they trust); a host they do not know is trusted on first contact (unless its pool asks for
`strict_host_key_checking`), its key pinned and announced with its fingerprint. Later
connections accept only the pinned key: the SSH handshake checks it, before authentication.
`ssh CLUSTER` uses the same files, so OpenSSH checks the same keys.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Sequence
from pathlib import Path

import asyncssh

from clusterctl._private import write_private_file

SYSTEM_KNOWN_HOSTS = Path("/etc/ssh/ssh_known_hosts")


def host_pattern(host: str, port: int) -> str:
    return host if port == 22 else f"[{host}]:{port}"


def user_known_hosts_files() -> list[Path]:
    return [Path(os.path.expanduser("~/.ssh/known_hosts")), SYSTEM_KNOWN_HOSTS]


@dataclasses.dataclass(frozen=True)
class KnownKeys:
    """What the user's files say about one host."""

    keys: Sequence[asyncssh.SSHKey] = ()
    authorities: Sequence[asyncssh.SSHKey] = ()
    revoked: Sequence[asyncssh.SSHKey] = ()

    def __bool__(self) -> bool:
        return bool(self.keys or self.authorities)


def fingerprint(key: asyncssh.SSHKey) -> str:
    return f"{key.get_algorithm()} {key.get_fingerprint('sha256')}"


class HostKeyStore:
    def __init__(self, path: Path, user_files: Sequence[Path] | None = None) -> None:
        self.path = path
        self._user_files = user_files
        self._user_cache: tuple[tuple[tuple[str, float, int], ...],
                                asyncssh.SSHKnownHosts | None] | None = None

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
                with contextlib.suppress(asyncssh.KeyImportError):
                    keys.append(asyncssh.import_public_key(f"{parts[1]} {parts[2]}"))
        return keys

    def known_by_user(self, host: str, port: int) -> KnownKeys:
        """Keys, CA keys and revoked keys the user's known_hosts files give `host:port`."""
        known = self._user_known_hosts()
        if known is None:
            return KnownKeys()
        keys, authorities, revoked, *_ = known.match(host, host, port)
        return KnownKeys(list(keys), list(authorities), list(revoked))

    def _user_known_hosts(self) -> asyncssh.SSHKnownHosts | None:
        files = self._user_files if self._user_files is not None else user_known_hosts_files()
        stamps = []
        for path in files:
            with contextlib.suppress(OSError):
                info = path.stat()
                stamps.append((str(path), info.st_mtime, info.st_size))
        if self._user_cache is None or self._user_cache[0] != tuple(stamps):
            known = None
            if stamps:
                try:
                    known = asyncssh.read_known_hosts([name for name, _, _ in stamps])
                except (OSError, ValueError, asyncssh.Error):
                    known = None  # a broken file of the user's: as if there were none
            self._user_cache = (tuple(stamps), known)
        return self._user_cache[1]

    def pin(self, host: str, port: int, key: asyncssh.SSHKey) -> None:
        entry = f"{host_pattern(host, port)} {key.export_public_key('openssh').decode().strip()}"
        self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        with os.fdopen(fd, "a") as f:
            f.write(entry + "\n")

    def forget(self, host: str, port: int) -> None:
        pattern = host_pattern(host, port)
        lines = self._lines()
        kept = [line for line in lines if line.split()[:1] != [pattern]]
        if len(kept) != len(lines):
            write_private_file(str(self.path), "".join(f"{line}\n" for line in kept).encode())
