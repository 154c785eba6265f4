"""A cluster's cost split over its jobs and the rest, and a managed job's over its attempts,
on made-up records."""

from __future__ import annotations

import datetime

import pytest

from clusterd.cost.attribution import JobSpan, by_day, managed_job_cost, split_cluster
from clusterd.cost.ledger import RUNNING, STOPPED, Interval

H = 3600.0


def interval(start: float, end: float | None, kind: str = RUNNING, nodes: int = 2,
             price: float = 1.0, disk: float = 0.0) -> Interval:
    return Interval("c", 0.0, "c-1", "ssh", "ssh/p", None, nodes, kind, start, end,
                    price, disk, "test")


def test_setup_jobs_and_idle() -> None:
    # 2 nodes at $1/h each: $2/h. UP after 1 h; job 1 on both nodes for 2 h; job 2 on one
    # node for 1 h (overlapping job 1's second hour: the two claim 1.5 nodes, share that
    # hour 2:1); then 1 h idle.
    split = split_cluster([interval(0, 5 * H)], [1 * H],
                          [JobSpan(1, 1 * H, 3 * H, nodes=2), JobSpan(2, 2 * H, 3 * H, nodes=1),
                           JobSpan(3, None, None)], now=10 * H)
    assert split.provisioning == pytest.approx(2.0)
    assert split.jobs[1] == pytest.approx(2.0 + 2.0 * 2 / 3)
    assert split.jobs[2] == pytest.approx(2.0 / 3)
    assert 3 not in split.jobs
    assert split.idle == pytest.approx(2 * 2.0)
    assert split.total == pytest.approx(10.0)


def test_a_job_on_part_of_the_nodes_leaves_the_rest_idle() -> None:
    split = split_cluster([interval(0, None, nodes=4)], [0.0], [JobSpan(7, 0, None, nodes=1)],
                          now=1 * H)
    assert split.jobs[7] == pytest.approx(1.0)  # a quarter of $4/h, for the hour to now
    assert split.idle == pytest.approx(3.0)


def test_stopped_disks_and_the_window() -> None:
    split = split_cluster([interval(0, 2 * H), interval(2 * H, None, STOPPED, disk=0.5)],
                          [0.5 * H], [], now=4 * H, since=1 * H)
    assert split.provisioning == 0.0  # before the window
    assert split.idle == pytest.approx(2.0)  # 1 h UP in the window, 2 nodes at $1/h
    assert split.stopped == pytest.approx(2 * 0.5 * 2)  # 2 nodes' disks for 2 h


def test_never_up_is_all_provisioning() -> None:
    split = split_cluster([interval(10 * H, 11 * H)], [2 * H], [], now=20 * H)
    assert split.provisioning == pytest.approx(2.0) and split.idle == 0


def test_a_managed_job_names_its_recoveries() -> None:
    cost = managed_job_cost([(200.0, 3.0), (100.0, 1.5), (300.0, 0.25)])
    assert (cost.total, cost.recoveries, cost.attempts) == (4.75, 4.5, 3)
    assert managed_job_cost([]).total == 0


def test_by_day_cuts_at_utc_midnight() -> None:
    midnight = datetime.datetime(2026, 3, 2, tzinfo=datetime.UTC).timestamp()
    days = by_day([interval(midnight - H, midnight + 2 * H)], now=midnight + 10 * H)
    assert days == {"2026-03-01": pytest.approx(2.0), "2026-03-02": pytest.approx(4.0)}
