"""The agent's credentials (node_shared/auth.py): each made with the cluster's token over a nonce
the agent issued, good for one call, within a short time. The agent's own use of them is in
tests/integration/test_agent.py."""

from __future__ import annotations

import pytest

from clusterd.node_shared.auth import (
    MAX_NONCES_PER_CALL,
    NonceBook,
    credential_is_valid,
    daemon_credential,
    new_nonce,
    new_token,
)


class Clock:
    """Time that moves only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


def test_a_credential_is_good_for_one_call(clock: Clock) -> None:
    book, token = NonceBook(ttl_s=60, clock=clock), new_token()
    (nonce,) = book.issue(1)
    credential = daemon_credential(token, nonce)
    assert credential_is_valid(token, credential, book)
    assert not credential_is_valid(token, credential, book)
    assert len(book) == 0


def test_a_nonce_the_agent_never_issued_is_refused(clock: Clock) -> None:
    book, token = NonceBook(ttl_s=60, clock=clock), new_token()
    book.issue(4)
    assert not credential_is_valid(token, daemon_credential(token, new_nonce()), book)


def test_a_nonce_past_its_lifetime_is_refused(clock: Clock) -> None:
    book, token = NonceBook(ttl_s=60, clock=clock), new_token()
    fresh, stale = book.issue(2)
    clock.now += 59.9
    assert credential_is_valid(token, daemon_credential(token, fresh), book)
    clock.now += 0.2
    assert not credential_is_valid(token, daemon_credential(token, stale), book)
    assert len(book) == 0  # an expired nonce is forgotten, not kept


def test_a_wrong_mac_does_not_use_the_nonce_up(clock: Clock) -> None:
    """Else anyone who can reach the socket could burn the daemon's nonces as they go by."""
    book, token = NonceBook(ttl_s=60, clock=clock), new_token()
    (nonce,) = book.issue(1)
    assert not credential_is_valid(token, daemon_credential(new_token(), nonce), book)
    assert credential_is_valid(token, daemon_credential(token, nonce), book)


def test_outstanding_nonces_are_bounded_and_the_oldest_go_first(clock: Clock) -> None:
    book, token = NonceBook(ttl_s=60, capacity=8, clock=clock), new_token()
    first = book.issue(8)
    clock.now += 1
    second = book.issue(3)
    assert len(book) == 8
    assert not credential_is_valid(token, daemon_credential(token, first[0]), book)
    assert credential_is_valid(token, daemon_credential(token, first[3]), book)
    assert all(credential_is_valid(token, daemon_credential(token, n), book) for n in second)


def test_one_call_gets_a_bounded_number_of_distinct_nonces(clock: Clock) -> None:
    book = NonceBook(ttl_s=60, clock=clock)
    nonces = book.issue(10**9)
    assert len(nonces) == MAX_NONCES_PER_CALL == len(set(nonces))
    assert book.issue(0) == [] and book.issue(-3) == []


@pytest.mark.parametrize("value", [
    None, "", "x", "a.b", "a.b.c", "zz." + "00" * 32, b"\xff\xfe", "0" * 300,
    "00" * 16 + "." + "00" * 32 + ".00",
])
def test_malformed_credentials_are_refused(clock: Clock, value: str | bytes | None) -> None:
    book, token = NonceBook(ttl_s=60, clock=clock), new_token()
    book.issue(4)
    assert not credential_is_valid(token, value, book)
