"""What clusters and jobs cost: prices (prices.py), the ledger of node time (ledger.py), the
split of a cluster's cost over its jobs (attribution.py) and the report (report.py)."""
