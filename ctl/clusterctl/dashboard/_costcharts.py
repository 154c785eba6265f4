"""The cost page's drawings and numbers, pure: dollars as text, spend per day as stacked
bars (one series per provider, or per cluster with the smallest gathered as "other"), and
a cost's split (jobs, setup, idle, stopped disks) as one thin bar. Inline SVG, as
`_charts.py` draws; every text from the daemon is escaped here."""

from __future__ import annotations

import datetime
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from markupsafe import Markup, escape

# The bar chart's frame (viewBox units; the SVG scales to its box).
BAR_W, BAR_H = 1000, 230
LEFT, BOTTOM, TOP = 64, 24, 10
MAX_DAY_LABELS = 10
SERIES_COLOURS = 8  # cost-s0 .. cost-s7 in the stylesheet; "other" is cost-other
OTHER = "other"
# A split's parts, in the order drawn, with their words and classes.
SPLIT_PARTS = (("jobs", "jobs", "split-jobs"), ("provisioning", "setup", "split-setup"),
               ("idle", "idle", "split-idle"), ("stopped", "stopped disks", "split-stopped"))


def money(value: float | None) -> str:
    """Dollars as a person reads them: cents from a cent up, with thousands separated;
    below a cent, enough digits to see it is not nothing."""
    if value is None:
        return "-"
    if value == 0:
        return "$0"
    if abs(value) >= 0.01:
        return f"${value:,.2f}"
    return f"${value:.2g}" if abs(value) >= 1e-6 else "<$0.000001"


def rate(value: float | None) -> str:
    return "-" if value is None else f"{money(value)}/h"


def share(part: float, whole: float) -> str:
    """`part` as a percentage of `whole` (whole numbers; "<1 %" for a sliver)."""
    if whole <= 0:
        return "0 %"
    percent = 100 * part / whole
    if 0 < percent < 1:
        return "<1 %"
    return f"{percent:.0f} %"


def window_days(since: float, until: float) -> list[str]:
    """Every UTC day (YYYY-MM-DD) from `since`'s to `until`'s, so that days without spend
    are drawn as gaps, not left out."""
    first = datetime.datetime.fromtimestamp(since, datetime.UTC).date()
    last = datetime.datetime.fromtimestamp(until, datetime.UTC).date()
    count = max(0, (last - first).days) + 1
    return [(first + datetime.timedelta(days=n)).isoformat() for n in range(count)]


@dataclass(frozen=True)
class Series:
    label: str
    css: str  # its colour's class
    days: Mapping[str, float]  # dollars per day

    @property
    def total(self) -> float:
        return sum(self.days.values())


def _add(into: dict[str, float], days: Iterable[Mapping[str, Any]]) -> None:
    for day in days:
        into[day["day"]] = into.get(day["day"], 0.0) + float(day["cost"])


def by_provider(provider_days: Iterable[Mapping[str, Any]]) -> list[Series]:
    """A series per provider, the biggest first, from the report's `provider_days` (every
    cluster's, listed or not)."""
    found: dict[str, dict[str, float]] = {}
    for entry in provider_days:
        _add(found.setdefault(str(entry["provider"]), {}), [entry])
    ordered = sorted(found.items(), key=lambda item: -sum(item[1].values()))
    return [Series(name, _colour(index), days) for index, (name, days) in enumerate(ordered)]


def by_cluster(clusters: Sequence[Mapping[str, Any]], shown: int = SERIES_COLOURS - 1,
               unlisted: Mapping[str, float] | None = None, unlisted_count: int = 0
               ) -> list[Series]:
    """A series per cluster name (its incarnations together), the `shown` biggest, and the
    rest as one series "other", with `unlisted` (dollars per day of the clusters the report
    did not list, `unlisted_count` of them)."""
    found: dict[str, dict[str, float]] = {}
    for cluster in clusters:
        _add(found.setdefault(str(cluster["name"]), {}), cluster.get("days") or [])
    ordered = sorted(found.items(), key=lambda item: -sum(item[1].values()))
    series = [Series(name, _colour(index), days)
              for index, (name, days) in enumerate(ordered[:shown])]
    rest: dict[str, float] = {}
    for _, days in ordered[shown:]:
        _add(rest, ({"day": d, "cost": c} for d, c in days.items()))
    _add(rest, ({"day": d, "cost": c} for d, c in (unlisted or {}).items()))
    others = max(0, len(ordered) - shown) + unlisted_count
    if rest:
        series.append(Series(OTHER + f" ({others})", "cost-other", rest))
    return series


def unlisted_days(days: Iterable[Mapping[str, Any]], clusters: Sequence[Mapping[str, Any]]
                  ) -> dict[str, float]:
    """Dollars per day of what a report did not list: its days' totals less its listed
    clusters' days (what is left of rounding, under a millionth, is nothing)."""
    listed: dict[str, float] = {}
    for cluster in clusters:
        _add(listed, cluster.get("days") or [])
    left = {str(d["day"]): float(d["cost"]) - listed.get(str(d["day"]), 0.0) for d in days}
    return {day: dollars for day, dollars in left.items() if dollars > 1e-6}


def _colour(index: int) -> str:
    return f"cost-s{index % SERIES_COLOURS}"


def nice_top(value: float) -> float:
    """The smallest 1, 2 or 5 times a power of ten at or above `value` (the axis' top)."""
    if value <= 0:
        return 1.0
    power = 10.0 ** math.floor(math.log10(value))
    return next(float(step * power) for step in (1, 2, 5, 10)
                if step * power >= value * (1 - 1e-9))


def grid_steps(top: float) -> int:
    """How many steps the axis up to `top` (from nice_top) is cut into so that each is a
    round number too: 2 in 4 steps of .5, 1 and 5 in 5 steps of .2 and 1."""
    lead = round(top / 10.0 ** math.floor(math.log10(top)))
    return 4 if lead == 2 else 5


def stacked_days(days: Sequence[str], series: Sequence[Series], label: str) -> Markup:
    """Spend per day as bars, each stacked from its series (in order, the first at the
    bottom); a title on every piece says whose and how much."""
    plot_w, plot_h = BAR_W - LEFT, BAR_H - BOTTOM - TOP
    totals = [sum(s.days.get(day, 0.0) for s in series) for day in days]
    top = nice_top(max(totals, default=0.0))
    slot = plot_w / max(1, len(days))
    width = max(1.0, slot * 0.7)
    parts = [f'<svg class="cost-chart" viewBox="0 0 {BAR_W} {BAR_H}" role="img" '
             f'aria-label="{escape(label)}" preserveAspectRatio="xMinYMin meet">']
    steps = grid_steps(top)
    for tick in range(steps + 1):  # the grid, at round numbers
        value = top * tick / steps
        y = round(TOP + plot_h * (1 - tick / steps), 1)
        parts.append(f'<line class="cost-grid" x1="{LEFT}" y1="{y}" x2="{BAR_W}" y2="{y}"/>'
                     f'<text class="cost-tick" x="{LEFT - 6}" y="{y + 4}">'
                     f"{escape(money(value))}</text>")
    every = math.ceil(len(days) / MAX_DAY_LABELS) or 1
    for index, day in enumerate(days):
        x = LEFT + slot * index + (slot - width) / 2
        bottom = float(TOP + plot_h)
        pieces = []
        for one in series:
            dollars = one.days.get(day, 0.0)
            if dollars <= 0:
                continue
            height = plot_h * dollars / top
            bottom -= height
            pieces.append(
                f'<rect class="{one.css}" x="{round(x, 1)}" y="{round(bottom, 1)}" '
                f'width="{round(width, 1)}" height="{round(max(height, 0.5), 1)}" '
                f'data-series="{escape(one.label)}" data-cost="{dollars:.6f}">'
                f"<title>{escape(f'{day} {one.label}: {money(dollars)}')}</title></rect>")
        parts.append(f'<g class="cost-day" data-day="{day}" data-cost="{totals[index]:.6f}">'
                     f'{"".join(pieces)}<title>{day}: {escape(money(totals[index]))}</title>'
                     "</g>")
        if index % every == 0:
            parts.append(f'<text class="cost-tick cost-day-label" x="{round(x + width / 2, 1)}"'
                         f' y="{BAR_H - 6}">{day[5:]}</text>')
    parts.append(f'<line class="cost-axis" x1="{LEFT}" y1="{TOP + plot_h}" x2="{BAR_W}" '
                 f'y2="{TOP + plot_h}"/></svg>')
    return Markup("".join(parts))


def split_parts(split: Mapping[str, Any]) -> list[tuple[str, str, float]]:
    """A split (`cost_report`'s `{provisioning, idle, stopped, jobs: [{job_id, cost}]}`) as
    (word, class, dollars) in the order drawn."""
    values = {"jobs": sum(float(j["cost"]) for j in split.get("jobs") or []),
              "provisioning": float(split.get("provisioning") or 0.0),
              "idle": float(split.get("idle") or 0.0),
              "stopped": float(split.get("stopped") or 0.0)}
    return [(word, css, values[key]) for key, word, css in SPLIT_PARTS]


SPLIT_W, SPLIT_H = 120, 10


def split_bar(split: Mapping[str, Any]) -> Markup:
    """A split as one bar, each part as wide as its share (nothing spent: an empty bar)."""
    parts = split_parts(split)
    whole = sum(dollars for _, _, dollars in parts)
    drawn = [f'<svg class="split-bar" viewBox="0 0 {SPLIT_W} {SPLIT_H}" width="{SPLIT_W}" '
             f'height="{SPLIT_H}" role="img" aria-label="split">',
             f'<rect class="split-none" width="{SPLIT_W}" height="{SPLIT_H}"/>']
    x = 0.0
    for word, css, dollars in parts:
        if whole <= 0 or dollars <= 0:
            continue
        width = SPLIT_W * dollars / whole
        drawn.append(f'<rect class="{css}" x="{round(x, 2)}" width="{round(width, 2)}" '
                     f'height="{SPLIT_H}"><title>{escape(word)}: {escape(money(dollars))} '
                     f"({share(dollars, whole)})</title></rect>")
        x += width
    drawn.append("</svg>")
    return Markup("".join(drawn))


BUDGET_W, BUDGET_H = 200, 12


def budget_bar(spent: float, monthly: float, warn_at: float, level: str) -> Markup:
    """Spent of a month's budget as a filled bar (full past it), with a tick at warn_at;
    coloured by the budget's recorded level."""
    filled = 0.0 if monthly <= 0 else min(1.0, max(0.0, spent / monthly))
    warn_x = round(BUDGET_W * min(1.0, max(0.0, warn_at)), 1)
    return Markup(
        f'<svg class="budget-bar" viewBox="0 0 {BUDGET_W} {BUDGET_H}" width="{BUDGET_W}" '
        f'height="{BUDGET_H}" role="img" aria-label="budget spent">'
        f'<rect class="budget-empty" width="{BUDGET_W}" height="{BUDGET_H}" rx="2"/>'
        f'<rect class="budget-fill budget-{escape(level)}" width="{round(BUDGET_W * filled, 1)}"'
        f' height="{BUDGET_H}" rx="2"/>'
        f'<line class="budget-warn" x1="{warn_x}" y1="0" x2="{warn_x}" y2="{BUDGET_H}"/>'
        f"<title>{escape(money(spent))} of {escape(money(monthly))} "
        f"({share(spent, monthly)})</title></svg>")
