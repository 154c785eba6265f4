"""providers/aws/creation: RunInstances' ClientToken (EC2 binds a token to its reservation for
a day after its instances die, so it must be the same for a retried call of one launch attempt
and new for a new attempt: a lost node made again), and which instances a launch keeps."""

from __future__ import annotations

from clusterd.providers.aws.creation import TAG_ROLE, client_token, kept_and_extra


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


def _instance(instance_id: str, role: str, state: str = "running") -> dict[str, object]:
    return {"InstanceId": instance_id, "State": {"Name": state},
            "Tags": [{"Key": TAG_ROLE, "Value": role}]}


def test_a_cluster_keeps_one_head_and_its_workers_first_made_first() -> None:
    # A retried RunInstances that took effect twice (an EC2 without ClientToken support):
    # the listing shows a second head and a third worker of a 3-node cluster.
    known = [_instance("i-h1", "head"), _instance("i-w1", "worker"), _instance("i-w2", "worker")]
    listed = [*known, _instance("i-h2", "head"), _instance("i-w3", "worker")]
    kept, extra = kept_and_extra(known, listed, 3)
    assert [i["InstanceId"] for i in kept] == ["i-h1", "i-w1", "i-w2"]
    assert extra == ["i-h2", "i-w3"]


def test_dead_instances_are_neither_kept_nor_terminated_again() -> None:
    # The listing is fresher than what the launch knew: a worker it made has died since.
    known = [_instance("i-h1", "head"), _instance("i-w1", "worker")]
    listed = [_instance("i-h1", "head"), _instance("i-w1", "worker", "shutting-down"),
              _instance("i-w2", "worker")]
    kept, extra = kept_and_extra(known, listed, 2)
    assert [i["InstanceId"] for i in kept] == ["i-h1", "i-w2"] and extra == []
