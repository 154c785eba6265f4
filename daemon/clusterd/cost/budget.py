"""Budgets: what the user allows to be spent in a calendar month, and what happens near and
past it (issue 39 §3). This module is the budget controller's pure part: the budget as the
config file says it, what the controller observes through a `SpendMeter` (the ledger), and
`decide`, the step from (budget, recorded state, observation) to the one thing to do next.
The controller (budget_controller.py) records each decision before acting on it.

One budget is the whole account's (`budget.monthly`); each provider may have its own
(`budget.providers.aws.monthly`), observed on that provider's spend alone. A month is the
calendar month in UTC: spend since its first second.
"""

from __future__ import annotations

import dataclasses
import datetime
import enum
from typing import Protocol


class SpendMeter(Protocol):
    """What a budget needs of the ledger (cost/ledger.py's Ledger satisfies it): dollars
    spent in [since, until) (open intervals accrue to now), dollars per hour of what runs now,
    and the clusters with an open interval (spending now). `provider` None: every provider."""

    async def spend(self, since: float, until: float | None = None,
                    provider: str | None = None) -> float: ...

    async def burn_rate(self, provider: str | None = None) -> float: ...

    async def spenders(self, provider: str | None = None) -> list[str]: ...


class BudgetAction(enum.StrEnum):
    """What crossing the budget does to the clusters that spend. Every action refuses new
    launches until the budget is raised."""

    WARN = "warn"  # an event and a notice only
    STOP = "stop"  # stop where the provider can stop, else down; managed jobs cancelled
    DOWN = "down"  # tear down


ACTIONS = tuple(str(a) for a in BudgetAction)


@dataclasses.dataclass(frozen=True)
class Budget:
    """One budget as configured. `provider` None: the account's."""

    monthly: float  # dollars per calendar month (UTC)
    warn_at: float = 0.8  # fraction of `monthly` at which to warn
    action: BudgetAction = BudgetAction.WARN
    provider: str | None = None

    @property
    def key(self) -> str:
        return self.provider or "*"

    def label(self) -> str:
        return f"the {self.provider} budget" if self.provider else "the monthly budget"


class Level(enum.StrEnum):
    """Where a budget's month stands, as recorded (the controller's persisted state)."""

    CLEAR = "clear"
    WARNED = "warned"
    EXCEEDED = "exceeded"  # acted on; launches refused until the budget is raised


@dataclasses.dataclass(frozen=True)
class BudgetState:
    """A budget's record: its level this month, and the budget it was reached at (so a raised
    budget is seen as raised, not as a new month)."""

    key: str
    month: str  # "2026-12"
    level: Level = Level.CLEAR
    monthly_at_level: float = 0.0
    # The action taken on exceeding, once it is done: a kill -9 between the decision and
    # its end repeats the action (idempotent: stopping what still spends).
    acted: bool = False
    spent: float = 0.0  # dollars this month when the level was recorded
    text: str = ""  # what the last decision said (the notice while not CLEAR)


@dataclasses.dataclass(frozen=True)
class Observed:
    month: str
    spent: float  # dollars this month so far
    burn_rate: float  # dollars per hour now
    spenders: tuple[str, ...]  # clusters spending now
    now: float


class Decision(enum.StrEnum):
    WARN = "warn"  # crossed warn_at: an event, a notice
    ACT = "act"  # crossed the budget: record EXCEEDED, then act and refuse launches
    ALL_CLEAR = "all-clear"  # back under (a raised budget, or a new month)


@dataclasses.dataclass(frozen=True)
class Step:
    decision: Decision
    text: str  # what the event and the notice say


def month_of(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.UTC).strftime("%Y-%m")


def month_start(ts: float) -> float:
    day = datetime.datetime.fromtimestamp(ts, datetime.UTC)
    return day.replace(day=1, hour=0, minute=0, second=0, microsecond=0).timestamp()


async def measure(meter: SpendMeter, provider: str | None, now: float, *,
                  spenders: bool = False) -> Observed:
    """A budget's month so far as the meter says it now (the clusters spending only if
    asked: the controller needs them, a view does not)."""
    spent = await meter.spend(month_start(now), None, provider)
    rate = await meter.burn_rate(provider)
    spending = tuple(await meter.spenders(provider)) if spenders else ()
    return Observed(month_of(now), spent, rate, spending, now)


def level_in(state: BudgetState, month: str) -> Level:
    """The level recorded for `month`: a record of an earlier month is clear."""
    return state.level if state.month == month else Level.CLEAR


def projection(budget: Budget, spent: float, burn_rate: float, now: float) -> str:
    """"at this rate the budget is reached on DATE" (or not this month)."""
    left = budget.monthly - spent
    if left <= 0:
        return "the budget is reached"
    if burn_rate <= 0:
        return "nothing spends now"
    reached = now + left / burn_rate * 3600
    if month_of(reached) != month_of(now):
        return "at this rate the budget is not reached this month"
    when = datetime.datetime.fromtimestamp(reached, datetime.UTC)
    return f"at this rate the budget is reached on {when:%Y-%m-%d %H:%M} UTC"


def dollars(amount: float) -> str:
    """Money as the messages say it: to the cent, and a spend under a cent to four places
    (a budget of a fraction of a cent is exceeded by "$0.0012", not "$0.00"; as
    `clusterctl cost-report` writes it)."""
    return f"${amount:.2f}" if amount >= 0.01 or amount == 0 else f"${amount:.4f}"


def describe(budget: Budget, seen: Observed) -> str:
    return (f"{budget.label()}: {dollars(seen.spent)} of ${budget.monthly:g} spent in "
            f"{seen.month} ({seen.spent / budget.monthly:.0%}), ${seen.burn_rate:.4g}/h now; "
            f"{projection(budget, seen.spent, seen.burn_rate, seen.now)}")


def decide(budget: Budget, state: BudgetState, seen: Observed) -> Step | None:
    """The next thing to do for `budget`, or None. Pure. A new month, or a budget raised
    above what was spent, clears; crossing the budget acts (once per level, and again after
    a restart that found the action not done); crossing warn_at warns once."""
    fresh = state.month != seen.month
    level = Level.CLEAR if fresh else state.level
    over = seen.spent >= budget.monthly
    warn = seen.spent >= budget.monthly * budget.warn_at
    if over:
        if level != Level.EXCEEDED or not state.acted:
            return Step(Decision.ACT, f"{describe(budget, seen)}: budget exceeded")
        return None
    if level == Level.EXCEEDED or (level == Level.WARNED and not warn):
        return Step(Decision.ALL_CLEAR, f"{describe(budget, seen)}: under the budget again")
    if warn and level == Level.CLEAR:
        return Step(Decision.WARN, f"{describe(budget, seen)}: past {budget.warn_at:.0%} "
                    "of the budget")
    if fresh and state.level != Level.CLEAR:
        return Step(Decision.ALL_CLEAR, f"{describe(budget, seen)}: a new month")
    return None


def refusal(budget: Budget, spent: float, config_path: str) -> str:
    """Why a launch is refused while `budget` is exceeded, and how to raise it."""
    key = (f"budget.providers.{budget.provider}.monthly" if budget.provider
           else "budget.monthly")
    return (f"{budget.label()} of ${budget.monthly:g} is exceeded ({dollars(spent)} spent this "
            f"month): new launches are refused until it is raised; raise {key} in "
            f"{config_path}")
