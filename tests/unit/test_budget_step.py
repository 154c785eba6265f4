"""The budget controller's decisions (cost/budget.py's `decide`), on made-up budgets, records
and observations: warn once, act once (again if a restart found it undone), all-clear when
the budget is raised or a month begins; and the projection at the current burn rate."""

from __future__ import annotations

import datetime

from clusterd.cost.budget import (
    Budget,
    BudgetAction,
    BudgetState,
    Decision,
    Level,
    Observed,
    decide,
    month_of,
    month_start,
    projection,
    refusal,
)

NOW = datetime.datetime(2026, 12, 6, 12, 0, tzinfo=datetime.UTC).timestamp()
BUDGET = Budget(100.0, 0.8, BudgetAction.STOP)


def seen(spent: float, rate: float = 1.0, now: float = NOW) -> Observed:
    return Observed(month_of(now), spent, rate, ("c1",), now)


def state(level: Level = Level.CLEAR, acted: bool = False, month: str = "2026-12"
          ) -> BudgetState:
    return BudgetState("*", month, level, 100.0, acted)


def test_under_the_warning_nothing_happens() -> None:
    assert decide(BUDGET, state(), seen(79.0)) is None


def test_crossing_warn_at_warns_once() -> None:
    step = decide(BUDGET, state(), seen(80.0))
    assert step is not None and step.decision == Decision.WARN
    assert "$80.00 of $100 spent in 2026-12 (80%)" in step.text
    assert decide(BUDGET, state(Level.WARNED), seen(85.0)) is None


def test_crossing_the_budget_acts_until_the_action_is_done() -> None:
    for level in (Level.CLEAR, Level.WARNED):
        step = decide(BUDGET, state(level), seen(100.0))
        assert step is not None and step.decision == Decision.ACT
    # Recorded EXCEEDED but not acted (a kill -9 in between): act again.
    again = decide(BUDGET, state(Level.EXCEEDED), seen(120.0))
    assert again is not None and again.decision == Decision.ACT
    assert decide(BUDGET, state(Level.EXCEEDED, acted=True), seen(120.0)) is None


def test_a_raised_budget_clears() -> None:
    raised = Budget(200.0, 0.8, BudgetAction.STOP)
    step = decide(raised, state(Level.EXCEEDED, acted=True), seen(120.0))
    assert step is not None and step.decision == Decision.ALL_CLEAR
    # Raised above the warning too: a warned budget clears.
    cleared = decide(raised, state(Level.WARNED), seen(90.0))
    assert cleared is not None and cleared.decision == Decision.ALL_CLEAR


def test_a_new_month_clears() -> None:
    step = decide(BUDGET, state(Level.EXCEEDED, acted=True, month="2026-11"), seen(3.0))
    assert step is not None and step.decision == Decision.ALL_CLEAR
    assert "a new month" in step.text


def test_projection_names_the_day_the_budget_is_reached() -> None:
    # $40 left at $2/h: 20 h from noon on the 6th.
    assert projection(BUDGET, 60.0, 2.0, NOW) == (
        "at this rate the budget is reached on 2026-12-07 08:00 UTC")
    assert projection(BUDGET, 60.0, 0.001, NOW) == (
        "at this rate the budget is not reached this month")
    assert projection(BUDGET, 60.0, 0.0, NOW) == "nothing spends now"
    assert projection(BUDGET, 100.0, 2.0, NOW) == "the budget is reached"


def test_month_start_is_the_first_second_of_the_utc_month() -> None:
    assert month_start(NOW) == datetime.datetime(2026, 12, 1, tzinfo=datetime.UTC).timestamp()


def test_refusal_says_the_budget_the_spend_and_how_to_raise_it() -> None:
    aws = Budget(50.0, 0.8, BudgetAction.DOWN, "aws")
    text = refusal(aws, 51.25, "/home/u/.config/clusterd/config.yaml")
    assert "the aws budget of $50 is exceeded ($51.25 spent this month)" in text
    assert "raise budget.providers.aws.monthly in /home/u/.config/clusterd/config.yaml" in text


def test_a_spend_under_a_cent_is_said_to_four_places() -> None:
    # A budget of a fraction of a cent, exceeded: "$0.00 spent" would say nothing was.
    text = refusal(Budget(monthly=0.001), 0.00123, "/c.yaml")
    assert "budget of $0.001 is exceeded ($0.0012 spent this month)" in text, text
