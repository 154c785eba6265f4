"""The cluster token: how the daemon and its agent know each other.

A random token is made per cluster runtime by the daemon, handed to the agent on stdin (never
argv) and kept on the head in a 0600 file. It never crosses the wire:

* Handshake: the daemon sends a fresh nonce; the agent answers with a nonce of its own and
  `HMAC(token, "agent" | client_nonce | server_nonce)`. A process that merely answers at the
  agent's socket path (a stale socket taken over by someone else) cannot, and the daemon
  sends it nothing more.
* Every later call carries `nonce.HMAC(token, "daemon" | nonce)` in its metadata, over a
  nonce the agent issued (IssueNonces) a short while ago. The agent remembers what it issued
  (NonceBook) and takes each nonce back once: a credential is good for one call, within
  NONCE_TTL_S, on the agent that issued its nonce. So a credential seen going by (a core dump,
  an impostor at a stale socket collecting them over nonces of its own choosing) is of no use.
  The agent's interceptor refuses any call without a valid one (UNAUTHENTICATED).
  The labels differ, so the agent's answers are no use for forging the daemon's credential.

Imports no Ray and no gRPC: both sides use it.
"""

from __future__ import annotations

import collections
import hashlib
import hmac
import secrets
import time
from collections.abc import Callable

AUTH_METADATA = "x-clusterd-auth"
NONCE_BYTES = 16
TOKEN_BYTES = 32
# How long an issued nonce stays good: long enough for a call to reach the agent through a
# slow tunnel, short enough that a batch nobody used is soon forgotten.
NONCE_TTL_S = 60.0
# Bounds on what the agent keeps: the daemon asks for a few at a time.
MAX_NONCES_OUTSTANDING = 1024
MAX_NONCES_PER_CALL = 64
MAX_CREDENTIAL_CHARS = 256


def new_token() -> str:
    return secrets.token_hex(TOKEN_BYTES)


def new_nonce() -> bytes:
    return secrets.token_bytes(NONCE_BYTES)


def _mac(token: str, label: bytes, *parts: bytes) -> bytes:
    return hmac.new(token.encode(), label + b"\0" + b"".join(parts), hashlib.sha256).digest()


def agent_proof(token: str, client_nonce: bytes, server_nonce: bytes) -> bytes:
    return _mac(token, b"clusterd-agent", client_nonce, server_nonce)


def proof_is_valid(token: str, client_nonce: bytes, server_nonce: bytes, proof: bytes) -> bool:
    return len(server_nonce) == NONCE_BYTES and hmac.compare_digest(
        agent_proof(token, client_nonce, server_nonce), proof)


def daemon_credential(token: str, nonce: bytes) -> str:
    """The daemon's credential for one call, over a nonce the agent issued."""
    return f"{nonce.hex()}.{_mac(token, b'clusterd-daemon', nonce).hex()}"


class NonceBook:
    """The nonces an agent has issued and not yet seen used.

    Each is taken back at most once, and only within `ttl_s` of its issue. Bounded: at most
    `capacity` are outstanding; issuing past that forgets the oldest (the nearest to expiry,
    and a caller that asked for so many it did not use them all gets the refusals). Only
    the agent's own user can reach its socket, so the bound is against a runaway client, not
    a stranger. Not thread-safe: the agent uses it from its event loop only."""

    def __init__(self, ttl_s: float = NONCE_TTL_S, capacity: int = MAX_NONCES_OUTSTANDING,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.ttl_s = ttl_s
        self._capacity = capacity
        self._clock = clock
        # nonce -> when it expires; insertion order is expiry order (one lifetime for all).
        self._expiry: collections.OrderedDict[bytes, float] = collections.OrderedDict()

    def __len__(self) -> int:
        return len(self._expiry)

    def issue(self, count: int) -> list[bytes]:
        """Up to `count` (at most MAX_NONCES_PER_CALL) fresh nonces, remembered."""
        now = self._clock()
        self._forget_expired(now)
        nonces = [new_nonce()
                  for _ in range(max(0, min(count, MAX_NONCES_PER_CALL, self._capacity)))]
        for nonce in nonces:
            while len(self._expiry) >= self._capacity:
                self._expiry.popitem(last=False)
            self._expiry[nonce] = now + self.ttl_s
        return nonces

    def redeem(self, nonce: bytes) -> bool:
        """True, once, for a nonce issued here that has not expired."""
        expires = self._expiry.pop(nonce, None)
        return expires is not None and self._clock() < expires

    def _forget_expired(self, now: float) -> None:
        while self._expiry:
            oldest, expires = next(iter(self._expiry.items()))
            if expires > now:
                return
            del self._expiry[oldest]


def credential_is_valid(token: str, value: str | bytes | None, nonces: NonceBook) -> bool:
    """Is `value` a credential made with `token` over a nonce `nonces` holds? If so, the
    nonce is used up. A credential with a wrong MAC uses up nothing: else anyone at the
    socket could burn the daemon's nonces."""
    if value is None:
        return False
    if isinstance(value, bytes):
        value = value.decode(errors="replace")
    parts = value.split(".")
    if len(parts) != 2 or len(value) > MAX_CREDENTIAL_CHARS:
        return False
    try:
        nonce, mac = (bytes.fromhex(p) for p in parts)
    except ValueError:
        return False
    if len(nonce) != NONCE_BYTES:
        return False
    return hmac.compare_digest(_mac(token, b"clusterd-daemon", nonce), mac) and (
        nonces.redeem(nonce))
