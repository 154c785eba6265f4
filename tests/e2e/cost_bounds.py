"""What the cost e2e tests check of a cluster held for a measured time: its row of the cost
report, and its cost within the price x the shortest and longest time its nodes can have
been held (from the launch's end to down's start, from launch's start to down's end)."""

from __future__ import annotations

import json
from collections.abc import Callable
from subprocess import CompletedProcess
from typing import Any


def reported(ctl: Callable[..., CompletedProcess[str]], cluster: str
             ) -> tuple[dict[str, Any], dict[str, Any]]:
    """The whole cost report, and the cluster's one row of it."""
    report: dict[str, Any] = json.loads(ctl("cost-report", "--json").stdout)
    (row,) = [c for c in report["clusters"] if c["name"] == cluster]
    return report, row


def assert_held_between(row: dict[str, Any], per_hour: float, shortest_s: float,
                        longest_s: float) -> None:
    rate = per_hour / 3600
    assert rate * shortest_s <= row["cost"] <= rate * longest_s, (row, shortest_s, longest_s)
