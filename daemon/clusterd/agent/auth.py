"""The cluster token: how the daemon and its agent know each other.

A random token is made per cluster runtime by the daemon, handed to the agent on stdin (never
argv) and kept on the head in a 0600 file. It never crosses the wire:

* Handshake: the daemon sends a fresh nonce; the agent answers with a nonce of its own and
  `HMAC(token, "agent" | client_nonce | server_nonce)`. A process that merely answers at the
  agent's socket path (a stale socket taken over by someone else) cannot, and the daemon
  sends it nothing more.
* Every later call carries `client_nonce.server_nonce.HMAC(token, "daemon" | ...)` in its
  metadata; the agent's interceptor refuses any call without a valid one (UNAUTHENTICATED).
  The labels differ, so the agent's answers are no use for forging the daemon's credential.

Imports no Ray and no gRPC: both sides use it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

AUTH_METADATA = "x-clusterd-auth"
NONCE_BYTES = 16
TOKEN_BYTES = 32


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(token: str, label: bytes, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return hmac.new(token.encode(), label + b"\0" + client_nonce + server_nonce,
                    hashlib.sha256).digest()


def agent_proof(token: str, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(token, b"clusterd-agent", client_nonce, server_nonce)


def proof_is_valid(token: str, client_nonce: bytes, server_nonce: bytes, proof: bytes) -> bool:
    return len(server_nonce) == NONCE_BYTES and hmac.compare_digest(
        agent_proof(token, client_nonce, server_nonce), proof)


def daemon_credential(token: str, client_nonce: bytes, server_nonce: bytes) -> str:
    mac = _mac(token, b"clusterd-daemon", client_nonce, server_nonce)
    return f"{client_nonce.hex()}.{server_nonce.hex()}.{mac.hex()}"


def credential_is_valid(token: str, value: str | bytes | None) -> bool:
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    parts = value.split(".")
    if len(parts) != 3 or len(value) > 256:
        return False
    try:
        client_nonce, server_nonce, mac = (bytes.fromhex(p) for p in parts)
    except ValueError:
        return False
    if len(client_nonce) != NONCE_BYTES or len(server_nonce) != NONCE_BYTES:
        return False
    return hmac.compare_digest(
        _mac(token, b"clusterd-daemon", client_nonce, server_nonce), mac)
