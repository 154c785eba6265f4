"""Budgets' recorded state: one row per budget (its key: "*" for the account's, else the
provider's name) and their events. As the other stores, records live in memory and are
written through: every change is committed, with its event, before the call returns, so the
budget controller's decisions are on disk before it acts on them."""

from __future__ import annotations

import time

from clusterd.cost.budget import BudgetState, Level
from clusterd.state.db import Database


class BudgetStore:
    def __init__(self, db: Database) -> None:
        self._db = db
        self._states: dict[str, BudgetState] = {}

    async def load(self) -> None:
        rows = await self._db.fetchall(
            "SELECT key, month, level, monthly_at_level, acted, spent, text FROM budget_states")
        self._states = {row[0]: BudgetState(row[0], row[1], Level(row[2]), float(row[3]),
                                            bool(row[4]), float(row[5]), row[6])
                        for row in rows}

    def get(self, key: str, month: str) -> BudgetState:
        """The budget's record, or a clear one for `month` if it has none."""
        return self._states.get(key) or BudgetState(key, month)

    def all(self) -> list[BudgetState]:
        return list(self._states.values())

    async def put(self, state: BudgetState, kind: str) -> None:
        """Record `state` and an event of `kind` saying its text, in one transaction."""
        now = time.time()
        await self._db.write([
            ("INSERT INTO budget_states (key, month, level, monthly_at_level, acted, spent, "
             "text, updated_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?) ON CONFLICT (key) DO UPDATE "
             "SET month = excluded.month, level = excluded.level, monthly_at_level = "
             "excluded.monthly_at_level, acted = excluded.acted, spent = excluded.spent, "
             "text = excluded.text, updated_at = excluded.updated_at",
             (state.key, state.month, str(state.level), state.monthly_at_level,
              int(state.acted), state.spent, state.text, now)),
            ("INSERT INTO budget_events (ts, key, kind, text) VALUES (?, ?, ?, ?)",
             (now, state.key, kind, state.text)),
        ])
        self._states[state.key] = state

    async def events(self, key: str | None = None) -> list[tuple[float, str, str, str]]:
        rows = await self._db.fetchall(
            "SELECT ts, key, kind, text FROM budget_events" + (" WHERE key = ?" if key else "")
            + " ORDER BY id", (key,) if key else ())
        return [(float(r[0]), r[1], r[2], r[3]) for r in rows]
