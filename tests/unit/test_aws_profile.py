"""The nodes' bucket policy (providers/aws/profile.py): what it grants reads back from it, in
the forms IAM hands a policy back, and it grants objects only inside the buckets named."""

from __future__ import annotations

import json
from urllib.parse import quote

from clusterd.providers.aws import profile


def test_the_bucket_policy_reads_back_what_it_grants() -> None:
    document = profile.policy_document({"b", "a"})
    assert profile.granted_buckets(document) == {"a", "b"}
    assert profile.granted_buckets(json.dumps(document)) == {"a", "b"}
    assert profile.granted_buckets(quote(json.dumps(document))) == {"a", "b"}
    assert profile.granted_buckets(None) == set()


def test_objects_are_granted_inside_the_named_buckets_only() -> None:
    statements = {s["Sid"]: s for s in profile.policy_document({"ckpt"})["Statement"]}
    assert statements["Buckets"]["Resource"] == ["arn:aws:s3:::ckpt"]
    assert statements["Objects"]["Resource"] == ["arn:aws:s3:::ckpt/*"]
    assert not any("*" in a.split(":", 1)[1] for s in statements.values()
                   for a in s["Action"])


def test_each_daemon_has_a_role_of_its_own_that_iam_accepts() -> None:
    assert profile.role_name("clusterd-3fa9c1d2e4b5") == "clusterd-3fa9c1d2e4b5-node"
    assert profile.role_name("clusterd-a") != profile.role_name("clusterd-b")
    long = profile.role_name("clusterd-" + "x" * 100 + " /odd")
    assert len(long) <= 64 and long.endswith("-node")
    assert profile.cluster_policy_name("train/1 x") == "buckets-train-1-x"
