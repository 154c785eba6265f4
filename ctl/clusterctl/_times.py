"""`--since` and `--until`: a time ago (`30m`, `2h`, `1h30m`, `3d`, `1w`) or a local date and
time (`2026-12-06`, `2026-12-06 14:00`, ISO 8601), as Unix seconds; and jobs filtered by when
they were submitted. Imported only where a command takes these options."""

from __future__ import annotations

import re

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    from typing import Any

UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_AGO = re.compile(r"(?:(\d+(?:\.\d+)?)([smhdw]))+")
_PART = re.compile(r"(\d+(?:\.\d+)?)([smhdw])")


class TimeError(ValueError):
    """A WHEN that is neither a time ago nor a date and time."""


def parse_when(text: str, now: float) -> float:
    """Unix seconds of `text`: `now` less a time ago, or a local date and time."""
    word = text.strip().lower()
    if _AGO.fullmatch(word):
        return now - sum(float(n) * UNITS[u] for n, u in _PART.findall(word))
    from datetime import datetime  # only for a date given

    try:
        return datetime.fromisoformat(text.strip()).timestamp()
    except ValueError:
        raise TimeError(f"{text[:40]!r} is neither a time ago (30m, 2h, 3d, 1w) nor a date "
                        "and time (2026-12-06, '2026-12-06 14:00')") from None


def submitted_within(jobs: list[dict[str, Any]], since: str | None, until: str | None,
                     now: float) -> list[dict[str, Any]]:
    """The jobs submitted at or after `since` and before `until` (either may be None)."""
    low = parse_when(since, now) if since else float("-inf")
    high = parse_when(until, now) if until else float("inf")
    return [j for j in jobs if low <= float(j.get("submitted_at") or 0) < high]
