"""The note an agent leaves when it stops its cluster on its own, for the daemon to find."""

from __future__ import annotations

import json
import time
from pathlib import Path

MARKER = "autostopped.json"


def write_marker(state_dir: Path, reason: str, down: bool) -> None:
    (state_dir / MARKER).write_text(json.dumps({"reason": reason, "down": down,
                                                "at": time.time()}))


def read_marker(state_dir: Path) -> dict[str, object] | None:
    try:
        marker: dict[str, object] = json.loads((state_dir / MARKER).read_text())
        return marker
    except (OSError, ValueError):
        return None


def clear_marker(state_dir: Path) -> None:
    (state_dir / MARKER).unlink(missing_ok=True)
