"""What clusters and jobs cost (`clusterctl cost-report`, and the cost columns of `status`
and `jobs queue`): services/cost.py's report, the ledger's live numbers."""

from __future__ import annotations

from typing import Any

from clusterctl import protocol
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.managed.store import owner_tag
from clusterd.services.common import check_name
from clusterd.services.cost import CostService
from clusterd.state.clusters import ClusterStore

from .connection import Call

MAX_DAYS = 3650
MAX_LIMIT = 1_000_000


class CostHandlers:
    def __init__(self, cost: CostService, store: ClusterStore) -> None:
        self._cost = cost
        self._store = store

    def table(self) -> dict[str, Any]:
        return {protocol.CostReportArgs.op: self.cost_report}

    async def cost_report(self, call: Call, args: protocol.CostReportArgs) -> dict[str, Any]:
        if not 1 <= args.days <= MAX_DAYS:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"days must be from 1 to {MAX_DAYS}, got {args.days}")
        if not 0 <= args.limit <= MAX_LIMIT:
            raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                                f"limit must be from 0 (every cluster) to {MAX_LIMIT},"
                                f" got {args.limit}")
        if args.cluster:
            check_name(args.cluster)
        return await self._cost.report(args.days, args.limit, args.cluster)

    def managed_job_cost(self, job_id: int) -> float:
        """Dollars a managed job's clusters (every attempt's) have cost so far."""
        return round(self._cost.ledger.owner_cost(owner_tag(job_id)), 6)

    def live(self, names: list[str]) -> dict[str, list[float]]:
        """Per cluster: [dollars per hour now, dollars so far] (status's cost column)."""
        ledger = self._cost.ledger
        costs = {}
        for name in names:
            record = self._store.get(name)
            if record is not None:
                costs[name] = [round(ledger.rate(name), 6),
                               round(ledger.cost_so_far(record), 6)]
        return costs
