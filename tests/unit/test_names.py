"""Cluster name rules (clusterd.services.common)."""

from __future__ import annotations

import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.services import common
from clusterd.services.common import MAX_NAME_LENGTH, check_name, cloud_name_for, generated_name


@pytest.mark.parametrize(
    "name", ["dev", "my-cluster.1", "a", "A_b-c.d9", "x" * MAX_NAME_LENGTH, "sky-1a2b-root"]
)
def test_check_name_accepts(name: str) -> None:
    assert check_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "1abc", "-x", "a" * 64, "bad name", "x-", "x.", "_x", "a/b", "dév", "a b"]
)
def test_check_name_rejects_with_invalid_name(name: str) -> None:
    with pytest.raises(ProtocolError) as info:
        check_name(name)
    assert info.value.code == ErrorCode.INVALID_NAME
    shown = repr(name) if len(repr(name)) <= 40 else repr(name)[:37] + "..."
    assert info.value.message == f"invalid cluster name {shown}"
    assert "at most 63 characters" in info.value.hint


def test_check_name_rejects_trailing_newline() -> None:
    with pytest.raises(ProtocolError) as info:
        check_name("dev\n")
    assert info.value.code == ErrorCode.INVALID_NAME


def test_check_name_shortens_very_long_names_in_the_message() -> None:
    name = "a" * 200
    with pytest.raises(ProtocolError) as info:
        check_name(name)
    # A few dozen characters of it: enough to recognize, never a screenful.
    assert info.value.message == "invalid cluster name '" + "a" * 36 + "..."


def test_generated_name_passes_check_name() -> None:
    names = {generated_name() for _ in range(20)}
    for name in names:
        assert check_name(name) == name
        assert name.startswith("sky-")
    assert len(names) > 1  # a random part


@pytest.mark.parametrize(
    ("user", "suffix"),
    [("Alice.Smith-Jones", "alicesmi"), ("___", "user"), ("Bob", "bob"), ("9lives", "9lives")],
)
def test_generated_name_from_unusual_user_names(
    monkeypatch: pytest.MonkeyPatch, user: str, suffix: str
) -> None:
    monkeypatch.setattr(common.getpass, "getuser", lambda: user)
    name = generated_name()
    assert check_name(name) == name
    assert name.endswith(f"-{suffix}")
    prefix, random_part, _ = name.split("-", 2)
    assert prefix == "sky"
    assert len(random_part) == 4


def test_cloud_name_for_is_lowercase_with_unique_suffix() -> None:
    first = cloud_name_for("My_Cluster.1")
    second = cloud_name_for("My_Cluster.1")
    assert first.startswith("my-cluster-1-")
    assert first != second
    assert len(cloud_name_for("a" * 63)) == 50 + 1 + 6
