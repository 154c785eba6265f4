"""The daemon's own SSH key pair, for the nodes clusterd creates itself (cloud instances).

Made once, on first need, in the daemon's state directory (0600 in a 0700 directory). Only its
public half is ever handed out (imported into the cloud as a key pair); the private half never
leaves this machine.
"""

from __future__ import annotations

import dataclasses
import fcntl
import hashlib
import os
import threading
from pathlib import Path

import asyncssh

from clusterctl._private import write_private_file


@dataclasses.dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_openssh: str  # "ssh-ed25519 AAAA... clusterd"

    @property
    def digest(self) -> str:
        """Short, stable name for the key (cloud key-pair names derive from it)."""
        body = self.public_openssh.split()[1]
        return hashlib.sha256(body.encode()).hexdigest()[:10]


# One maker at a time in this process (the aws and kubernetes providers each hold a
# DaemonKey of the same directory, and launches ask from worker threads at once); the file
# lock covers another process on the same state (a second daemon that is about to step aside).
_MAKING = threading.Lock()


class DaemonKey:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._pair: KeyPair | None = None

    def ensure(self) -> KeyPair:
        """The key pair, made if it does not exist yet. Blocking, but only file work.

        Launches at once used to make a pair each and leave one's private half beside
        another's public half: every connection then failed ("Public key mismatch") or the
        nodes refused the key. Now one makes it, and the public half is always derived from
        the private key (a mismatched .pub left by an older daemon is written again)."""
        if self._pair is not None and self._pair.private_path.exists():
            return self._pair
        private = self._dir / "id_ed25519"
        public = private.with_suffix(".pub")
        with _MAKING:
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self._dir, 0o700)
            lock = os.open(self._dir / ".lock", os.O_WRONLY | os.O_CREAT, 0o600)
            try:
                fcntl.flock(lock, fcntl.LOCK_EX)
                if private.exists():
                    key = asyncssh.read_private_key(private)
                else:
                    key = asyncssh.generate_private_key("ssh-ed25519", comment="clusterd")
                    write_private_file(str(private), key.export_private_key())
                openssh = key.export_public_key().decode().strip()
                if not public.exists() or public.read_text().strip() != openssh:
                    write_private_file(str(public), (openssh + "\n").encode())
            finally:
                os.close(lock)  # and the flock with it
        self._pair = KeyPair(private, openssh)
        return self._pair

