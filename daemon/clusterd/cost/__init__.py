"""Cost: what clusters and jobs cost (the ledger) and budgets that act on it."""
