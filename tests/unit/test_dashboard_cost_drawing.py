"""What the dashboard draws of cost (no daemon, no browser): dollars as text, spend per day
as stacked bars by provider and by cluster, splits and budgets as bars, the cost page's
values from a report, the windows a page asks for, and the budget banner."""

from __future__ import annotations

import datetime
import re
import time
from typing import Any

import pytest

from clusterctl.dashboard._costcharts import (
    BAR_H,
    BOTTOM,
    SPLIT_W,
    TOP,
    Series,
    budget_bar,
    by_cluster,
    by_provider,
    money,
    nice_top,
    share,
    split_bar,
    stacked_days,
    unlisted_days,
    window_days,
)
from clusterctl.dashboard._costdata import covering, days_asked, page_view
from clusterctl.dashboard._views import environment
from clusterctl.protocol import Notice

DAY0 = datetime.datetime(2026, 5, 1, 12, tzinfo=datetime.UTC).timestamp()
PLOT_H = BAR_H - BOTTOM - TOP


@pytest.mark.parametrize(("value", "text"), [
    (None, "-"), (0, "$0"), (0.004, "$0.004"), (0.0123, "$0.01"), (1234.5, "$1,234.50"),
    (0.00000012, "<$0.000001"), (12.345, "$12.35")])
def test_money(value: float | None, text: str) -> None:
    assert money(value) == text


def test_share() -> None:
    assert (share(1, 4), share(0.001, 4), share(1, 0), share(4, 4)) == (
        "25 %", "<1 %", "0 %", "100 %")


def test_nice_top_is_one_two_or_five_times_a_power_of_ten_at_or_above() -> None:
    assert [nice_top(v) for v in (0, 0.03, 0.1, 1.01, 3, 7, 400)] == [
        1.0, 0.05, 0.1, 2.0, 5.0, 10.0, 500.0]


def test_window_days_include_days_without_spend() -> None:
    assert window_days(DAY0 - 2 * 86400, DAY0) == ["2026-04-29", "2026-04-30", "2026-05-01"]
    assert window_days(DAY0, DAY0) == ["2026-05-01"]


def cluster(name: str, provider: str, days: dict[str, float], **more: Any) -> dict[str, Any]:
    return {"name": name, "provider": provider, "live": True, "incarnation": 1.0,
            "days": [{"day": d, "cost": c} for d, c in days.items()],
            "cost": sum(days.values()), **more}


CLUSTERS = [
    cluster("big", "aws", {"2026-04-30": 3.0, "2026-05-01": 5.0}),
    cluster("pool", "ssh", {"2026-05-01": 1.0}),
    cluster("big", "aws", {"2026-04-29": 1.0}),  # an earlier incarnation of the same name
    cluster("tiny", "kubernetes", {"2026-05-01": 0.5}),
]


def provider_days(clusters: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A report's `provider_days` (the daemon sums every cluster's, listed or not)."""
    summed: dict[tuple[str, str], float] = {}
    for c in clusters:
        for d in c["days"]:
            key = (d["day"], c["provider"])
            summed[key] = summed.get(key, 0.0) + d["cost"]
    return [{"day": day, "provider": p, "cost": cost} for (day, p), cost in sorted(summed.items())]


def test_series_by_provider_and_by_cluster_biggest_first_with_the_rest_as_other() -> None:
    providers = by_provider(provider_days(CLUSTERS))
    assert [(s.label, s.css, s.total) for s in providers] == [
        ("aws", "cost-s0", 9.0), ("ssh", "cost-s1", 1.0), ("kubernetes", "cost-s2", 0.5)]
    names = by_cluster(CLUSTERS, shown=1)
    assert [(s.label, s.css, s.total) for s in names] == [
        ("big", "cost-s0", 9.0), ("other (2)", "cost-other", 1.5)]
    assert names[1].days == {"2026-05-01": 1.5}


def test_what_the_report_did_not_list_joins_other() -> None:
    # The report listed "big" and "pool"; two more clusters ($2 on 05-01, $0.25 on 04-30)
    # are only in its days.
    listed = CLUSTERS[:2]
    days = [{"day": "2026-04-30", "cost": 3.25}, {"day": "2026-05-01", "cost": 8.0}]
    left = unlisted_days(days, listed)
    assert left == {"2026-04-30": pytest.approx(0.25), "2026-05-01": pytest.approx(2.0)}
    names = by_cluster(listed, shown=1, unlisted=left, unlisted_count=2)
    assert [(s.label, s.total) for s in names] == [("big", 8.0), ("other (3)", 3.25)]
    assert unlisted_days(days[:1], [cluster("big", "aws", {"2026-04-30": 3.25})]) == {}


def rects(svg: str) -> list[dict[str, str]]:
    return [dict(re.findall(r'([\w-]+)="([^"]*)"', r)) for r in re.findall(r"<rect [^>]*>", svg)]


def test_stacked_days_bar_heights_are_proportional_and_stack_in_order() -> None:
    days = ["2026-04-30", "2026-05-01"]
    series = [Series("a", "cost-s0", {"2026-04-30": 1.0, "2026-05-01": 2.0}),
              Series("b", "cost-s1", {"2026-05-01": 2.0})]
    svg = str(stacked_days(days, series, "spend"))
    drawn = rects(svg)
    assert [(r["data-series"], float(r["data-cost"])) for r in drawn] == [
        ("a", 1.0), ("a", 2.0), ("b", 2.0)]
    # The top is 5 (the next nice number above 4): $1 is a fifth of the plot's height.
    heights = [float(r["height"]) for r in drawn]
    assert heights == pytest.approx([PLOT_H / 5, 2 * PLOT_H / 5, 2 * PLOT_H / 5], abs=0.1)
    first, second = drawn[1], drawn[2]  # the same day: b sits on a
    assert float(second["y"]) + float(second["height"]) == pytest.approx(float(first["y"]),
                                                                        abs=0.2)
    assert float(first["y"]) + float(first["height"]) == pytest.approx(TOP + PLOT_H, abs=0.2)
    assert first["x"] == second["x"] and float(drawn[0]["x"]) < float(first["x"])
    assert 'data-day="2026-05-01" data-cost="4.000000"' in svg
    assert ">$5.00<" in svg and ">$0<" in svg  # the axis' top and bottom


def test_stacked_days_escapes_names_and_labels_at_most_ten_days() -> None:
    days = window_days(DAY0 - 29 * 86400, DAY0)
    svg = str(stacked_days(days, [Series("<b>&", "cost-s0", {days[0]: 1.0})], "x"))
    assert "<b>" not in svg and "&lt;b&gt;&amp;" in svg
    assert len(re.findall(r'class="cost-tick cost-day-label"', svg)) == 10
    empty = str(stacked_days(days, [], "nothing"))
    assert "<rect" not in empty and empty.count('class="cost-day"') == 30


def test_split_bar_widths_are_shares() -> None:
    split = {"provisioning": 1.0, "idle": 2.0, "stopped": 0.0,
             "jobs": [{"job_id": 1, "cost": 0.5}, {"job_id": 2, "cost": 0.5}]}
    drawn = rects(str(split_bar(split)))
    widths = {r["class"]: float(r["width"]) for r in drawn}
    assert widths == pytest.approx({"split-none": SPLIT_W, "split-jobs": SPLIT_W * 0.25,
                                    "split-setup": SPLIT_W * 0.25,
                                    "split-idle": SPLIT_W * 0.5})
    assert [r["class"] for r in rects(str(split_bar({"jobs": []})))] == ["split-none"]


def test_budget_bar_fills_to_its_share_and_no_further() -> None:
    half = {r["class"]: r for r in rects(str(budget_bar(5.0, 10.0, 0.8, "clear")))}
    assert float(half["budget-fill budget-clear"]["width"]) == 100.0
    over = {r["class"]: r for r in rects(str(budget_bar(30.0, 10.0, 0.8, "exceeded")))}
    assert float(over["budget-fill budget-exceeded"]["width"]) == 200.0
    assert 'x1="160.0"' in str(budget_bar(0.0, 10.0, 0.8, "clear"))


def test_days_asked_and_the_window_a_page_needs() -> None:
    assert [days_asked(t) for t in (None, "", "7", "0", "99999", "x")] == [
        30, 30, 7, 1, 3650, 30]
    now = DAY0
    assert covering(now - 3600, now) == 7
    assert covering(now - 20 * 86400, now) == 30
    assert covering(now - 100 * 86400, now) == 365
    assert covering(None, now) == 7


def report() -> dict[str, Any]:
    split = {"provisioning": 0.5, "idle": 2.5, "stopped": 0.0, "jobs": [{"job_id": 1,
                                                                        "cost": 7.0}]}
    return {"since": DAY0 - 2 * 86400, "until": DAY0, "total": 10.0, "burn_rate": 1.5,
            "split": split,
            "clusters": [{**c, "infra": f"{c['provider']}/r", "nodes": 1, "owner": None,
                          "instance_type": None, "started_at": DAY0 - 3600,
                          "ended_at": None, "per_hour": 1.5, "split": split,
                          "sources": ["catalog"]} for c in CLUSTERS],
            "managed_jobs": [{"job_id": 3, "name": "small", "cost": 0.1, "recoveries": 0.0,
                              "attempts": 1},
                             {"job_id": 4, "name": "train", "cost": 4.5, "recoveries": 1.5,
                              "attempts": 2}],
            "providers": [], "days": [], "provider_days": provider_days(CLUSTERS),
            "others": {"clusters": 0, "cost": 0.0},
            "budgets": [{"provider": None, "monthly": 20.0, "warn_at": 0.8, "action": "stop",
                         "month": "2026-05", "spent": 17.0, "burn_rate": 1.5,
                         "level": "warned", "text": "past 80 %",
                         "projection": "at this rate the budget is reached on 2026-05-01 "
                                       "14:00 UTC"}]}


def test_the_cost_page_shows_idle_spenders_budgets_and_both_charts() -> None:
    view = page_view(report())
    assert [j["job_id"] for j in view["managed"]] == [4, 3]  # the biggest first
    html = environment().get_template("_cost.html").render(days=3, view=view)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "idle: $2.50 (25 % of spend)" in text
    assert "has-idle" in html and 'class="split-idle-cell idle-cost"' in html
    assert "$1.50/h" in text and "$36.00 a day at this rate" in text
    assert "$17.00 / $20.00 (85 %)" in text
    assert "at this rate the budget is reached on 2026-05-01 14:00 UTC" in text
    assert 'data-level="warned"' in html
    assert html.count('class="cost-chart"') == 2
    assert 'data-series="kubernetes"' in html and 'data-series="pool"' in html
    assert 'class="cost-recoveries"' in html  # job 4's recoveries stand out


def test_without_spend_or_budgets_the_page_says_so() -> None:
    empty = {"since": DAY0 - 86400, "until": DAY0, "total": 0, "burn_rate": 0, "split": {},
             "clusters": [], "managed_jobs": [], "budgets": []}
    html = environment().get_template("_cost.html").render(days=1, view=page_view(empty))
    assert "No budget is set" in html and "No cluster ran in this window" in html
    assert "idle: $0 (0 % of spend)" in html and "has-idle" not in html


def test_the_banner_draws_each_notice_at_the_level_the_daemon_gives() -> None:
    # The level is the daemon's word, not read from the text: an idle cluster's notice that
    # mentions "exceeded" in its name is still a warning.
    lines = (Notice("the monthly budget: $1.20 of $1 spent ...: budget exceeded; spender torn "
                    "down", "error", "budget"),
             Notice("the ssh budget: $0.90 of $1 spent ...: past 80% of the budget", "warn",
                    "budget"),
             Notice("cluster exceeded-2 has been idle for 2h with no autostop", "warn", "idle"))
    html = environment().get_template("_banner.html").render(lines=lines)
    assert html.count('role="alert"') == 3 and html.count('class="banner error"') == 1
    assert html.count('class="banner warn"') == 2
    assert html.count('href="/cost"') == 3
    assert environment().get_template("_banner.html").render(lines=()).strip() == ""


class FakeCache:
    """A ReportCache that answers with one report, and says which windows (and clusters)
    were asked."""

    def __init__(self, answer: dict[str, Any]) -> None:
        self.answer = answer
        self.asked: list[int] = []
        self.clusters: list[str] = []

    async def get(self, days: int, cluster: str = "") -> dict[str, Any]:
        self.asked.append(days)
        self.clusters.append(cluster)
        return self.answer


@pytest.mark.anyio
async def test_a_clusters_cost_is_its_running_incarnation_with_its_split() -> None:
    from clusterctl.dashboard._costdata import cluster_cost

    answer = report()
    answer["clusters"][2]["live"] = False  # big's earlier incarnation
    answer["clusters"][0].update(cost=8.0, per_hour=2.0)
    cache = FakeCache(answer)
    found = await cluster_cost(cache, "big", time.time() - 40 * 86400)  # type: ignore[arg-type]
    assert cache.asked == [90] and found["entry"]["cost"] == 8.0 and not found["error"]
    assert cache.clusters == ["big"]  # that cluster's incarnations, not the costliest 100
    html = environment().get_template("_cluster_cost.html").render(cluster="big", **found)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "$2.00/h" in text and "$8.00" in text
    assert 'class="idle-cost"' in html and "idle $2.50 (31 %)" in text
    assert 'href="/clusters/big/jobs/1"' in html
    missing = await cluster_cost(cache, "nope", None)  # type: ignore[arg-type]
    assert missing["entry"] is None and "nothing in the cost ledger" in missing["error"]


@pytest.mark.anyio
async def test_a_managed_jobs_cost_names_its_recoveries_and_each_attempt() -> None:
    from clusterctl.dashboard._costdata import managed_cost

    answer = report()
    answer["clusters"] = [
        {**answer["clusters"][0], "name": "mj-4", "owner": "managed-job:4",
         "incarnation": 200.0, "cost": 3.0, "live": True},
        {**answer["clusters"][0], "name": "mj-4", "owner": "managed-job:4",
         "incarnation": 100.0, "cost": 1.5, "live": False},
        {**answer["clusters"][0], "name": "other", "owner": None}]
    cache = FakeCache(answer)
    found = await managed_cost(cache,  # type: ignore[arg-type]
                               {"job_id": 4, "cost": 4.6, "submitted_at": DAY0,
                                "cluster": "mj-4"})
    assert cache.clusters == ["mj-4"]
    assert found["cost"] == 4.6 and found["entry"]["recoveries"] == 1.5
    assert [c["incarnation"] for c in found["attempts"]] == [100.0, 200.0]
    html = environment().get_template("_managed_cost.html").render(**found)
    text = " ".join(re.sub(r"<[^>]+>", " ", html).split())
    assert "Cost so far $4.60" in text and "Of it, recoveries $1.50" in text
    assert html.count("data-attempt-cost=") == 2


def test_the_axis_is_cut_at_round_numbers() -> None:
    for top, labels in ((0.4, ["$0", "$0.10", "$0.20", "$0.30", "$0.40", "$0.50"]),
                        (1.5, ["$0", "$0.50", "$1.00", "$1.50", "$2.00"]),
                        (9.0, ["$0", "$2.00", "$4.00", "$6.00", "$8.00", "$10.00"])):
        svg = str(stacked_days(["2026-05-01"], [Series("a", "cost-s0",
                                                       {"2026-05-01": top})], "x"))
        ticks = re.findall(r'<text class="cost-tick" [^>]*>([^<]*)</text>', svg)
        assert ticks == labels, (top, ticks)


@pytest.mark.anyio
async def test_a_jobs_cost_is_its_share_of_its_clusters() -> None:
    from clusterctl.dashboard._costdata import job_cost

    cache = FakeCache(report())
    found = await job_cost(cache, "big", {"job_id": 1,  # type: ignore[arg-type]
                                          "submitted_at": time.time()})
    assert (found["cost"], found["of"], found["error"]) == (7.0, 8.0, "")
    html = environment().get_template("_job_cost.html").render(**found)
    assert "$7.00" in html and "of the cluster's $8.00 so far" in html
    later = await job_cost(cache, "big", {"job_id": 2, "submitted_at": None})  # type: ignore[arg-type]
    assert later["cost"] is None and later["error"] == "nothing counted for it yet"


class CountingLink:
    def __init__(self) -> None:
        self.calls: list[int] = []
        self.asked: list[tuple[int, int, str]] = []

    async def call(self, args: Any) -> dict[str, Any]:
        self.calls.append(args.days)
        self.asked.append((args.days, args.limit, args.cluster))
        return {"days": args.days, "call": len(self.calls)}


@pytest.mark.anyio
async def test_reports_are_shared_while_fresh_and_few_are_held() -> None:
    from clusterctl.dashboard._costdata import PAGE_LISTED, REPORTS_HELD, ReportCache

    link = CountingLink()
    cache = ReportCache(link, max_age_s=60)  # type: ignore[arg-type]
    first = await cache.get(7)
    assert await cache.get(7) is first and link.calls == [7]
    # Never every cluster (a report of thousands could pass the frame limit): the cost
    # page's costliest, or one cluster's incarnations, each remembered apart.
    assert link.asked == [(7, PAGE_LISTED, "")]
    alone = await cache.get(7, "big")
    assert alone is not first and link.asked[-1] == (7, PAGE_LISTED, "big")
    assert await cache.get(7, "big") is alone and len(link.calls) == 2
    for days in range(100, 100 + REPORTS_HELD):
        await cache.get(days)
    await cache.get(7)  # pushed out by newer windows: asked again
    assert link.calls.count(7) == 3  # (7, "big") once, (7, "") twice
    stale = ReportCache(link, max_age_s=-1)  # type: ignore[arg-type]
    await stale.get(1)
    await stale.get(1)
    assert link.calls.count(1) == 2


def test_the_clusters_a_report_did_not_list_are_counted_and_drawn_as_other() -> None:
    unlisted = report()
    unlisted["others"] = {"clusters": 30, "cost": 6.0}
    unlisted["days"] = [{"day": "2026-05-01", "cost": 6.5 + 6.0}, {"day": "2026-04-30",
                                                                   "cost": 3.0},
                        {"day": "2026-04-29", "cost": 1.0}]
    view = page_view(unlisted)
    assert view["more_clusters"] == 30
    (other,) = [s for s in view["cluster_keys"] if s.label.startswith("other")]
    assert other.days == {"2026-05-01": pytest.approx(6.0)} and other.label == "other (30)"
    html = environment().get_template("_cost.html").render(days=3, view=view)
    assert "and 30 more that cost less" in html
    assert "clusterctl cost-report --days 3 --limit 0" in html
