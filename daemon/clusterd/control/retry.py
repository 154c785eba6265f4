"""How long a controller waits before trying a failed action again.

Gaps grow by `growth` from `first_s` to `max_s` (a relaunch with no capacity anywhere: try
again soon, then less often). A failure that was the provider throttling this account's
requests is different: every controller meets it at once, so waiting in step would meet it
together again. Its gap is at least the throttling backoff's, exponential and jittered ("equal
jitter", as providers/aws/throttle.py uses for single calls): concurrent controllers spread
out, none retries at once.
"""

from __future__ import annotations

import random

from clusterctl.protocol import ProtocolError
from clusterd.providers.aws.throttle import Backoff

# Above a provider's own retries of each call (which ride out minutes of throttling): the
# controller's retries back off from tens of seconds to a few minutes.
THROTTLE_BACKOFF = Backoff(base_s=20.0, cap_s=300.0)


def is_throttling(error: ProtocolError) -> bool:
    """Whether the action failed because the provider limited the request rate: a
    provider's ProvisionError says so, and so does failover's summary (launcher.NoPlacement)
    when any attempt was refused for it."""
    return bool(getattr(error, "throttled", False))


class RetryGaps:
    def __init__(self, first_s: float, max_s: float, growth: float = 1.5,
                 throttle: Backoff = THROTTLE_BACKOFF, rng: random.Random | None = None
                 ) -> None:
        self._gap = first_s
        self._max_s = max_s
        self._growth = growth
        self._throttle = throttle
        self._throttled = 0
        self._rng = rng or random.Random()

    def next(self, throttled: bool = False) -> float:
        """The gap before the next try, after a failure (`throttled`: the provider's)."""
        gap = self._gap
        self._gap = min(gap * self._growth, self._max_s)
        if throttled:
            gap = max(gap, self._throttle.delay(self._throttled, self._rng))
            self._throttled += 1
        return gap
