"""`budget:` in the config file: the account's budget and each provider's, validated with
errors that name the file and the key."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd.cost.budget import Budget, BudgetAction
from clusterd.user_config import ConfigError, parse

PATH = Path("/cfg.yaml")


def test_no_budget_is_none() -> None:
    assert parse(PATH, "strict: true\n").budgets == ()


def test_account_and_provider_budgets_inherit_warn_at_and_action() -> None:
    config = parse(PATH, "budget:\n  monthly: 200\n  warn_at: 0.5\n  action: stop\n"
                         "  providers:\n    aws: {monthly: 150, action: down}\n"
                         "    kubernetes: {monthly: 20}\n")
    assert config.budgets == (
        Budget(200.0, 0.5, BudgetAction.STOP),
        Budget(150.0, 0.5, BudgetAction.DOWN, "aws"),
        Budget(20.0, 0.5, BudgetAction.STOP, "kubernetes"))


def test_provider_budgets_alone() -> None:
    config = parse(PATH, "budget:\n  providers:\n    aws: {monthly: 0.01}\n")
    assert config.budgets == (Budget(0.01, 0.8, BudgetAction.WARN, "aws"),)


@pytest.mark.parametrize(("text", "key", "words"), [
    ("budget: 5\n", "budget", "expected a map"),
    ("budget: {monthly: 0}\n", "budget.monthly", "above 0"),
    ("budget: {monthly: yes}\n", "budget.monthly", "above 0"),
    ("budget: {monthly: 5, warn_at: 1.5}\n", "budget.warn_at", "at most 1"),
    ("budget: {monthly: 5, action: explode}\n", "budget.action", "warn, stop, down"),
    ("budget: {monthly: 5, montly: 6}\n", "budget.montly", "unknown key"),
    ("budget: {warn_at: 0.5}\n", "budget.monthly", "needs one"),
    ("budget: {providers: {aws: {warn_at: 0.5}}}\n", "budget.providers.aws",
     "with monthly"),
    ("budget: {providers: {aws: {monthly: 5, providers: {}}}}\n",
     "budget.providers.aws.providers", "unknown key"),
    ("budget: {providers: [aws]}\n", "budget.providers", "map of provider"),
])
def test_bad_budgets_are_refused_naming_the_key(text: str, key: str, words: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse(PATH, text)
    assert caught.value.message.startswith(f"/cfg.yaml: {key}: ")
    assert words in caught.value.message
