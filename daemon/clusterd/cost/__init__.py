"""What clusters and jobs cost: prices (prices.py), the ledger of node time (ledger.py), the
split of a cluster's cost over its jobs (attribution.py), the report (report.py), and budgets
that act on the ledger (budget.py, pure; budget_controller.py on the controller engine)."""
