"""pip, as the daemon runs it to fetch wheels for nodes (its own interpreter's pip)."""

from __future__ import annotations

import subprocess
import sys

from clusterctl.protocol import ErrorCode, ProtocolError

PIP_TIMEOUT_S = 1800  # fetching Ray and the rest for one kind of node, on a slow link


def pip_run(*args: str, building: str = "the runtime's wheelhouse") -> None:
    result = subprocess.run([sys.executable, "-m", "pip", "-q", "--disable-pip-version-check",
                             *args], capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    if result.returncode != 0:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"building {building} failed (pip {args[0]}): "
            f"{result.stderr.strip()[-800:]}",
            "the daemon needs the package index once per version to fetch the agent's wheels; "
            "with none in reach, run `clusterd --prepare-runtime` where there is one (with "
            "the same CLUSTERD_WHEELHOUSE_DIR)",
        )
