"""What of a job the agent keeps in memory only, never in its job database: the secrets, and
what had credentials written into a URL (`https://user:token@host/...`) in an env value or
in the setup or run script. The stored spec has those redacted; the job runs with them as
given. A job whose in-memory part an agent restart lost cannot run, and fails saying so
(Scheduler.fail_in_progress), as one with secrets always has."""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.redact import redact_urls

SCRIPTS = ("setup", "run")


@dataclasses.dataclass(frozen=True)
class InMemory:
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)  # set over the envs
    scripts: dict[str, str] = dataclasses.field(default_factory=dict)  # over the stored ones

    def __bool__(self) -> bool:
        return bool(self.secrets or self.scripts)

    def spec(self, stored: dict[str, Any]) -> dict[str, Any]:
        """The spec the job runs: the stored one with its scripts as given."""
        return {**stored, **self.scripts}

    def envs(self, stored: dict[str, str]) -> dict[str, str]:
        return {**stored, **self.secrets}


def split(spec: dict[str, Any], secrets: dict[str, str]) -> tuple[dict[str, Any], InMemory]:
    """(the spec as it may be stored, what is kept in memory only)."""
    envs: dict[str, str] = spec.get("envs") or {}
    stored_envs = {k: redact_urls(v) for k, v in envs.items()}
    credentials = {k: v for k, v in envs.items() if stored_envs[k] != v}
    scripts = {f: spec[f] for f in SCRIPTS if spec.get(f) and redact_urls(spec[f]) != spec[f]}
    stored = {**spec, "envs": stored_envs, **{f: redact_urls(v) for f, v in scripts.items()}}
    return stored, InMemory({**credentials, **secrets}, scripts)
