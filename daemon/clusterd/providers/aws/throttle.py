"""Riding out EC2's request-rate limits (`RequestLimitExceeded` and kin).

EC2 throttles per account and per action with a token bucket that refills over seconds to
minutes; many launches at once (a pool scaling up, a managed job's recoveries) meet it together.
botocore's retry modes give up after a handful of tries within seconds, so a throttled call
would fail a launch that only had to wait. Here a throttled call is tried again with
exponential backoff and jitter for minutes, as SkyPilot's AWS provisioner does (its boto
clients make up to 12 attempts with exponentially growing waits), bounded in total so that a
launch still ends: "equal jitter" (each wait between half and all of min(cap, base * 2**n)), so
that concurrent callers spread out but none retries at once. Each wait is logged and told to
the request it serves ("throttled by EC2, retrying in N s").
"""

from __future__ import annotations

import dataclasses
import random
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from clusterd import log

logger = log.get("clusterd.aws")

T = TypeVar("T")

THROTTLING_CODES = frozenset({
    "RequestLimitExceeded", "Throttling", "ThrottlingException", "TooManyRequestsException",
    "RequestThrottled", "SlowDown", "RequestLimitExceededException",
})


@dataclasses.dataclass(frozen=True)
class Backoff:
    base_s: float = 1.0
    cap_s: float = 20.0
    budget_s: float = 300.0  # the most a call waits in all, over its throttled tries

    def delay(self, attempt: int, rng: random.Random) -> float:
        """The wait before try `attempt + 1` (attempt 0 is the first retry)."""
        ceiling = min(self.cap_s, self.base_s * 2.0 ** min(attempt, 30))
        return ceiling / 2 + rng.uniform(0, ceiling / 2)


DEFAULT_BACKOFF = Backoff()


class Throttled(Exception):
    """A call still throttled when the budget ran out: how often and how long it waited."""

    def __init__(self, error: BaseException, tries: int, waited_s: float) -> None:
        super().__init__(str(error))
        self.error = error
        self.tries = tries
        self.waited_s = waited_s


async def retry_throttled(
    call: Callable[[], Awaitable[T]], is_throttled: Callable[[BaseException], bool],
    what: str, backoff: Backoff = DEFAULT_BACKOFF, *, rng: random.Random | None = None,
    sleep: Callable[[float], Awaitable[None]] = anyio.sleep,
    tell: Callable[[str], Awaitable[None]] | None = None,
) -> T:
    """call() until it is not throttled; raises Throttled once waiting longer would pass the
    budget (other errors pass through at once). `tell` gets one line per wait."""
    rng = rng or random.Random()
    waited = 0.0
    attempt = 0
    while True:
        try:
            return await call()
        except Exception as exc:
            if not is_throttled(exc):
                raise
            delay = backoff.delay(attempt, rng)
            if waited + delay > backoff.budget_s:
                raise Throttled(exc, attempt + 1, waited) from None
            attempt += 1
            text = f"throttled by EC2 ({what}), retrying in {delay:.0f} s (try {attempt + 1})"
            logger.info("throttled", call=what, delay_s=round(delay, 2), attempt=attempt,
                        waited_s=round(waited, 1))
            if tell is not None:
                await tell(text)
            await sleep(delay)
            waited += delay
