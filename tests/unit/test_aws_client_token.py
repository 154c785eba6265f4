"""RunInstances' ClientToken (providers/aws/provider.client_token): EC2 binds a token to its
reservation for a day after its instances die, so it must be the same for a retried call of
one launch attempt and new for a new attempt (a lost node made again)."""

from __future__ import annotations

from clusterd.providers.aws.provider import client_token


def test_the_same_attempt_gets_the_same_token() -> None:
    assert client_token("attempt-1", "us-east-1a", "worker", 1) == client_token(
        "attempt-1", "us-east-1a", "worker", 1)


def test_another_attempt_gets_another_token() -> None:
    # The repair of a preempted worker asks for one worker in the same zone, as the launch
    # that made it did: only the attempt tells them apart.
    assert client_token("attempt-1", "us-east-1a", "worker", 1) != client_token(
        "attempt-2", "us-east-1a", "worker", 1)


def test_each_call_of_an_attempt_has_its_own_token() -> None:
    tokens = {client_token("a", "us-east-1a", role, count)
              for role, count in (("head", 1), ("worker", 1), ("worker", 2))}
    assert len(tokens) == 3


def test_tokens_are_short_ascii_and_do_not_show_the_attempts_secret() -> None:
    token = client_token("the-secret", "us-east-1a", "head", 1)
    assert len(token) <= 64 and token.isascii() and "the-secret" not in token


def test_without_a_create_token_each_call_gets_its_own() -> None:
    assert client_token("", "z", "head", 1) != client_token("", "z", "head", 1)
