"""A budget's month as `cost_report` shows it (services/cost.py's budget_view): the level
recorded this month (an earlier month's record is clear), its text, and the projection."""

from __future__ import annotations

import datetime

from clusterd.cost.budget import Budget, BudgetAction, BudgetState, Level
from clusterd.services.cost import budget_view

NOW = datetime.datetime(2026, 5, 10, 12, tzinfo=datetime.UTC).timestamp()


def test_a_clear_budget_shows_spend_and_when_it_is_reached() -> None:
    budget = Budget(monthly=100.0, warn_at=0.8, action=BudgetAction.STOP)
    view = budget_view(budget, BudgetState("*", "2026-05"), "2026-05", 40.0, 1.0, NOW)
    assert view == {"provider": None, "monthly": 100.0, "warn_at": 0.8, "action": "stop",
                    "month": "2026-05", "spent": 40.0, "burn_rate": 1.0, "level": "clear",
                    "text": "",
                    "projection": "at this rate the budget is reached on 2026-05-13 00:00 UTC"}


def test_the_level_recorded_this_month_is_shown_with_its_text() -> None:
    budget = Budget(monthly=1.0, provider="ssh")
    warned = BudgetState("ssh", "2026-05", Level.WARNED, 1.0, False, 0.9, "past 80 %")
    view = budget_view(budget, warned, "2026-05", 0.95, 0.0, NOW)
    assert (view["provider"], view["level"], view["text"]) == ("ssh", "warned", "past 80 %")
    assert view["projection"] == "nothing spends now"


def test_last_months_level_is_not_this_months() -> None:
    budget = Budget(monthly=1.0)
    old = BudgetState("*", "2026-04", Level.EXCEEDED, 1.0, True, 2.0, "exceeded")
    view = budget_view(budget, old, "2026-05", 0.0, 0.0, NOW)
    assert (view["level"], view["text"]) == ("clear", "")
