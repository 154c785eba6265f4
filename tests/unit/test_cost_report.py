"""The cost report built from made-up ledger records: per cluster incarnation with its split,
per managed job with its recoveries, per provider, per day, totals."""

from __future__ import annotations

import datetime

import pytest

from clusterd.cost.attribution import JobSpan
from clusterd.cost.ledger import RUNNING, STOPPED, Interval
from clusterd.cost.report import Window, build

H = 3600.0
DAY0 = datetime.datetime(2026, 5, 1, tzinfo=datetime.UTC).timestamp()


def interval(cluster: str, incarnation: float, start: float, end: float | None,
             kind: str = RUNNING, provider: str = "aws", owner: str | None = None) -> Interval:
    return Interval(cluster, incarnation, f"{cluster}-x", provider, f"{provider}/r", "m", 1,
                    kind, start, end, 1.0, 0.5, "catalog on-demand", owner)


def test_report() -> None:
    records = [
        interval("dev", DAY0, DAY0, DAY0 + 2 * H),
        interval("dev", DAY0, DAY0 + 2 * H, None, STOPPED),
        # A managed job's cluster, preempted after 1 h, then made again.
        interval("mj", DAY0, DAY0, DAY0 + H, owner="managed-job:4"),
        interval("mj", DAY0 + 2 * H, DAY0 + 2 * H, None, owner="managed-job:4"),
        interval("pool", DAY0, DAY0 + H, DAY0 + 3 * H, provider="ssh"),
    ]
    up = {"dev": [DAY0 + 0.5 * H], "mj": [DAY0, DAY0 + 2 * H], "pool": [DAY0 + H]}
    jobs = {("dev", DAY0): [JobSpan(1, DAY0 + 0.5 * H, DAY0 + 1.5 * H)]}
    report = build(Window(DAY0 - H, DAY0 + 4 * H), records, up,
                   lambda name, inc: jobs.get((name, inc), ()), {4: "train"})
    dev = next(c for c in report["clusters"] if c["name"] == "dev")
    # $1.5/h running (node + disk) for 2 h; $0.5/h stopped for 2 h.
    assert dev["cost"] == pytest.approx(4.0)
    assert dev["split"]["provisioning"] == pytest.approx(0.75)
    assert dev["split"]["jobs"] == [{"job_id": 1, "cost": pytest.approx(1.5)}]
    assert dev["split"]["idle"] == pytest.approx(0.75)
    assert dev["split"]["stopped"] == pytest.approx(1.0)
    assert dev["live"] and dev["per_hour"] == 0.5
    assert [c["name"] for c in report["clusters"]].count("mj") == 2  # two incarnations
    [train] = report["managed_jobs"]
    assert train == {"job_id": 4, "name": "train", "cost": pytest.approx(4.5),
                     "recoveries": pytest.approx(1.5), "attempts": 2}
    assert {p["provider"]: p["cost"] for p in report["providers"]} == {
        "aws": pytest.approx(8.5), "ssh": pytest.approx(3.0)}
    assert report["total"] == pytest.approx(11.5)
    assert report["days"] == [{"day": "2026-05-01", "cost": pytest.approx(11.5)}]
    assert report["burn_rate"] == pytest.approx(2.0)


def test_an_empty_ledger_is_an_empty_report() -> None:
    report = build(Window(0, 1), [], {}, lambda name, inc: (), {})
    assert (report["total"], report["clusters"], report["days"]) == (0, [], [])


def test_each_cluster_has_its_own_days_cut_at_midnight() -> None:
    """The dashboard stacks spend per day by cluster and by provider from these."""
    records = [interval("late", DAY0, DAY0 - H, DAY0 + 2 * H),  # 1 h before midnight, 2 after
               interval("pool", DAY0, DAY0 + H, DAY0 + 3 * H, provider="ssh")]
    report = build(Window(DAY0 - 2 * H, DAY0 + 4 * H), records, {},
                   lambda name, inc: (), {})
    days = {c["name"]: c["days"] for c in report["clusters"]}
    assert days["late"] == [{"day": "2026-04-30", "cost": pytest.approx(1.5)},
                            {"day": "2026-05-01", "cost": pytest.approx(3.0)}]
    assert days["pool"] == [{"day": "2026-05-01", "cost": pytest.approx(3.0)}]
    # Together, the clusters' days are the report's.
    summed: dict[str, float] = {}
    for cluster_days in days.values():
        for day in cluster_days:
            summed[day["day"]] = summed.get(day["day"], 0.0) + day["cost"]
    assert {d["day"]: pytest.approx(d["cost"]) for d in report["days"]} == summed


def test_a_limit_lists_the_costliest_and_totals_all() -> None:
    # Cluster cN ran N hours at $1.5/h (node and disk).
    records = [interval(f"c{n}", DAY0, DAY0, DAY0 + n * H) for n in range(1, 6)]
    whole = build(Window(DAY0, DAY0 + 6 * H), records, {}, lambda name, inc: (), {})
    top = build(Window(DAY0, DAY0 + 6 * H), records, {}, lambda name, inc: (), {}, limit=2)
    assert [c["name"] for c in top["clusters"]] == ["c5", "c4"]
    assert top["clusters"] == whole["clusters"][:2]
    assert top["others"] == {"clusters": 3, "cost": pytest.approx(1.5 * (1 + 2 + 3))}
    assert whole["others"] == {"clusters": 0, "cost": 0.0}
    for key in ("total", "split", "providers", "days", "provider_days", "burn_rate"):
        assert top[key] == whole[key]


def test_one_clusters_incarnations_alone_with_the_totals_of_all() -> None:
    # "a" ran twice (two incarnations), the cheapest both times: a limit would not list it.
    records = [interval("a", DAY0, DAY0, DAY0 + H), interval("a", DAY0 + 2 * H, DAY0 + 2 * H,
                                                             DAY0 + 3 * H),
               *(interval(f"c{n}", DAY0, DAY0, DAY0 + (n + 2) * H) for n in range(3))]
    whole = build(Window(DAY0, DAY0 + 6 * H), records, {}, lambda name, inc: (), {})
    only = build(Window(DAY0, DAY0 + 6 * H), records, {}, lambda name, inc: (), {}, limit=1,
                 only="a")
    assert [(c["name"], c["incarnation"]) for c in only["clusters"]] == [
        ("a", DAY0), ("a", DAY0 + 2 * H)]
    assert only["others"]["clusters"] == 3
    for key in ("total", "split", "providers", "days", "provider_days", "burn_rate"):
        assert only[key] == whole[key]


def test_spend_per_day_by_provider_sums_to_the_days() -> None:
    records = [interval("late", DAY0, DAY0 - H, DAY0 + 2 * H),
               interval("pool", DAY0, DAY0 + H, DAY0 + 3 * H, provider="ssh")]
    report = build(Window(DAY0 - 2 * H, DAY0 + 4 * H), records, {},
                   lambda name, inc: (), {})
    assert [(d["day"], d["provider"]) for d in report["provider_days"]] == [
        ("2026-04-30", "aws"), ("2026-05-01", "aws"), ("2026-05-01", "ssh")]
    assert [d["cost"] for d in report["provider_days"]] == [
        pytest.approx(1.5), pytest.approx(3.0), pytest.approx(3.0)]
    assert {d["day"]: d["cost"] for d in report["days"]} == {
        "2026-04-30": pytest.approx(1.5), "2026-05-01": pytest.approx(6.0)}
