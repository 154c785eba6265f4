"""When EC2 says an instance started and stopped, in epoch seconds: what the cost ledger
dates a change by when it finds one after a gap (see NodeInfo.launched_at / stopped_at).

- Start: `LaunchTime`, which EC2 moves to the latest start when a stopped instance starts
  again (the first launch is only in its primary interface's AttachTime).
- Stop or termination: only in `StateTransitionReason`, as free text that names the time
  when the change was asked for through the API ("User initiated (2026-12-06 17:20:01 GMT)";
  moto writes "UTC"; EC2's own changes, a spot interruption, say "Service initiated (...)"),
  to the second. A shutdown from inside the instance gives no time ("User initiated
  shutdown"): then none is known.
"""

from __future__ import annotations

import datetime
import re
from typing import Any

_REASON_TIME = re.compile(r"\((\d{4}-\d\d-\d\d \d\d:\d\d:\d\d) (?:GMT|UTC)\)")


def launched_at(launch_time: Any) -> float | None:
    """`LaunchTime` as the API client gave it (a datetime), or as a handle records it (its
    text), in epoch seconds; None if there is none."""
    if isinstance(launch_time, datetime.datetime):
        when = launch_time
    elif isinstance(launch_time, str) and launch_time:
        try:
            when = datetime.datetime.fromisoformat(launch_time)
        except ValueError:
            return None
    else:
        return None
    if when.tzinfo is None:  # EC2 answers in UTC
        when = when.replace(tzinfo=datetime.UTC)
    return when.timestamp()


def stopped_at(instance: dict[str, Any]) -> float | None:
    """When a stopped, stopping, shutting-down or terminated instance was told to go, from
    its StateTransitionReason; None for a running one, or a reason with no time in it."""
    if instance.get("State", {}).get("Name") in ("pending", "running"):
        return None
    found = _REASON_TIME.search(str(instance.get("StateTransitionReason") or ""))
    if found is None:
        return None
    return datetime.datetime.strptime(found.group(1), "%Y-%m-%d %H:%M:%S").replace(
        tzinfo=datetime.UTC).timestamp()
