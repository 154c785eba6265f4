"""The daemon's own SSH key pair, for the nodes clusterd creates itself (cloud instances).

Made once, on first need, in the daemon's state directory (0600 in a 0700 directory). Only its
public half is ever handed out (imported into the cloud as a key pair); the private half never
leaves this machine.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path

import asyncssh


@dataclasses.dataclass(frozen=True)
class KeyPair:
    private_path: Path
    public_openssh: str  # "ssh-ed25519 AAAA... clusterd"

    @property
    def digest(self) -> str:
        """Short, stable name for the key (cloud key-pair names derive from it)."""
        body = self.public_openssh.split()[1]
        return hashlib.sha256(body.encode()).hexdigest()[:10]


class DaemonKey:
    def __init__(self, directory: Path) -> None:
        self._dir = directory
        self._pair: KeyPair | None = None

    def ensure(self) -> KeyPair:
        """The key pair, made if it does not exist yet. Blocking, but only file work."""
        if self._pair is not None and self._pair.private_path.exists():
            return self._pair
        private = self._dir / "id_ed25519"
        public = private.with_suffix(".pub")
        if not (private.exists() and public.exists()):
            self._dir.mkdir(mode=0o700, parents=True, exist_ok=True)
            os.chmod(self._dir, 0o700)
            key = asyncssh.generate_private_key("ssh-ed25519", comment="clusterd")
            tmp = private.with_suffix(".tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(key.export_private_key())
            public.write_bytes(key.export_public_key())
            tmp.replace(private)  # the private key last: both exist once it does
        self._pair = KeyPair(private, public.read_text().strip())
        return self._pair
