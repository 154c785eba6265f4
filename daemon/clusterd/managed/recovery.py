"""A managed job's recovery policy: SkyPilot's `resources.job_recovery` (old name
`spot_recovery`), read from the task as submitted.

    resources:
      job_recovery:            # or a bare strategy name: job_recovery: FAILOVER
        strategy: FAILOVER     # the region it was lost in first, then anywhere (the default)
        max_restarts_on_errors: 2   # user failures (non-zero exit) retried this many times

EAGER_NEXT_REGION tries every other region first. Either way the relaunch's first round
skips the zone (FAILOVER) or region (EAGER_NEXT_REGION) where the job was just lost (a spot
preemption says capacity is short there); if that round finds nothing, the next one tries
everywhere, so the place it was lost in is used again once capacity comes back.
"""

from __future__ import annotations

import dataclasses
import enum
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.providers.base import BlockScope, Placement
from clusterd.provision.failover import Steering
from clusterd.safe_yaml import YAMLProblem, safe_load

MAX_RESTARTS = 1000


class Strategy(enum.StrEnum):
    FAILOVER = "FAILOVER"
    EAGER_NEXT_REGION = "EAGER_NEXT_REGION"


@dataclasses.dataclass(frozen=True)
class RecoveryPolicy:
    strategy: Strategy = Strategy.FAILOVER
    max_restarts_on_errors: int = 0

    def may_restart(self, restarts_so_far: int) -> bool:
        """Whether a user failure after `restarts_so_far` retries is retried once more."""
        return restarts_so_far < self.max_restarts_on_errors

    def steering(self, lost: Placement | None) -> Steering | None:
        """How a relaunch after losing the cluster placed at `lost` (by its provider, region
        and zone) orders its first round; None with nothing to go on."""
        if lost is None:
            return None
        where = Placement(lost.provider, lost.region, lost.zone, None, 0, 0)
        if self.strategy == Strategy.EAGER_NEXT_REGION:
            return Steering(avoid=((where, BlockScope.REGION),))
        # A provider without zones (a Kubernetes context) is not skipped: it is its region.
        avoid = ((where, BlockScope.ZONE),) if where.zone else ()
        return Steering((where.provider, where.region), avoid)


def _invalid(source: str, message: str) -> ProtocolError:
    return ProtocolError(ErrorCode.INVALID_TASK, f"{source}: resources.job_recovery: {message}",
                         "e.g. job_recovery: {strategy: FAILOVER, max_restarts_on_errors: 2}")


def policy_from_yaml(yaml_text: str | None, source: str = "<task>") -> RecoveryPolicy:
    """The policy of a task YAML (the default for a command or a task without one).
    Only the top-level `resources` is read: a job's recovery is one for all its choices."""
    if not yaml_text:
        return RecoveryPolicy()
    try:
        raw = safe_load(yaml_text)
    except YAMLProblem:
        return RecoveryPolicy()  # the loader has refused it already, naming the problem
    resources = raw.get("resources") if isinstance(raw, dict) else None
    if not isinstance(resources, dict):
        return RecoveryPolicy()
    value = resources.get("job_recovery", resources.get("spot_recovery"))
    return parse_policy(value, source)


def parse_policy(value: Any, source: str = "<task>") -> RecoveryPolicy:
    if value is None:
        return RecoveryPolicy()
    if isinstance(value, str):
        value = {"strategy": value}
    if not isinstance(value, dict):
        raise _invalid(source, "must be a strategy name or a map")
    unknown = sorted(str(k) for k in value if k not in ("strategy", "max_restarts_on_errors"))
    if unknown:
        raise _invalid(source, f"unknown field {', '.join(unknown)}")
    name = value.get("strategy") or Strategy.FAILOVER
    if not isinstance(name, str) or name.upper() not in Strategy.__members__:
        raise _invalid(source, f"strategy must be one of {', '.join(Strategy)}, got {name!r}")
    strategy = Strategy(name.upper())
    restarts = value.get("max_restarts_on_errors", 0)
    if (not isinstance(restarts, int) or isinstance(restarts, bool)
            or not 0 <= restarts <= MAX_RESTARTS):
        raise _invalid(source, f"max_restarts_on_errors must be a whole number from 0 to "
                               f"{MAX_RESTARTS}, got {restarts!r}")
    return RecoveryPolicy(strategy, restarts)
