"""Plain-text output helpers of clusterctl (clusterctl._render)."""

from __future__ import annotations

import time

import pytest

from clusterctl._render import age, table


def test_table_aligns_columns_to_the_widest_cell() -> None:
    text = table(
        ["NAME", "STATUS", "NODES"], [["dev", "UP", "1"], ["my-long-name", "STOPPED", "12"]]
    )
    assert text == (
        "NAME          STATUS   NODES\n"
        "dev           UP       1\n"
        "my-long-name  STOPPED  12\n"
    )


def test_table_strips_trailing_spaces_and_stringifies_cells() -> None:
    text = table(["A", "LONG HEADER"], [[1, ""], [22, "x"]])  # type: ignore[list-item]
    assert text.splitlines() == ["A   LONG HEADER", "1", "22  x"]
    assert text.endswith("\n")


def test_table_with_no_rows_is_just_the_header() -> None:
    assert table(["NAME", "STATUS"], []) == "NAME  STATUS\n"


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s ago"),
        (42, "42s ago"),
        (60, "1m ago"),
        (119, "1m ago"),
        (3599, "59m ago"),
        (3600, "1h ago"),
        (86399, "23h ago"),
        (86400, "1d ago"),
        (3 * 86400 + 5, "3d ago"),
    ],
)
def test_age_units(seconds: float, text: str) -> None:
    assert age(1_000_000.0, until=1_000_000.0 + seconds) == text


def test_age_no_timestamp_and_suffix_and_future() -> None:
    assert age(None) == "-"
    assert age(0) == "-"
    assert age(100.0, until=190.0, suffix="") == "1m"
    assert age(200.0, until=100.0) == "0s ago"  # clock skew never shows negative ages


def test_age_defaults_to_now() -> None:
    assert age(time.time() - 7200) == "2h ago"


def test_age_never_shows_sixty_seconds() -> None:
    assert age(1000.0, until=1059.7) in ("59s ago", "1m ago")
