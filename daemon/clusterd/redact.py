"""What the daemon keeps or shows of what users give it, with the secrets taken out.

Secrets are the task's `secrets` (from its YAML or `--secret`), `GIT_TOKEN` wherever it comes
from, and credentials written into URLs (`https://user:token@host/...`). They reach the job
and nothing else: not the requests table, events, progress, logs or error messages.
"""

from __future__ import annotations

import re
from typing import Any

import yaml

from clusterctl.protocol import SECRET_FIELDS
from clusterd.safe_yaml import YAMLProblem, safe_load

REDACTED = "<redacted>"
# Environment variables that are secrets even when a task lists them under `envs`.
SECRET_ENV_NAMES = frozenset({"GIT_TOKEN"})
# scheme://USERINFO@ : the userinfo (a user, a token, or both) goes.
_URL_CREDENTIALS = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s@'\"]+@")


def redact_urls(text: str) -> str:
    """`https://user:token@host/x` -> `https://<redacted>@host/x`, anywhere in `text`."""
    return _URL_CREDENTIALS.sub(rf"\1{REDACTED}@", text) if "@" in text else text


def redact_values(value: Any) -> Any:
    """`value` with URL credentials removed from every string in it (in lists and dict
    values too: env values, a command's words)."""
    if isinstance(value, str):
        return redact_urls(value)
    if isinstance(value, list):
        return [redact_values(item) for item in value]
    if isinstance(value, dict):
        return {key: redact_values(item) for key, item in value.items()}
    return value


def redact_envs(envs: dict[str, Any]) -> dict[str, Any]:
    """Environment variables as they may be stored and shown: secret ones' values replaced,
    URL credentials removed from the others'."""
    return {k: REDACTED if k in SECRET_ENV_NAMES else redact_values(v) for k, v in envs.items()}


def redact_task_yaml(text: str) -> str:
    """A task's YAML as it may be stored and shown: the values of `secrets` (and of any
    `envs` that are secrets) replaced, URL credentials removed. The text is re-written only
    when it holds such values; otherwise it is kept as the user wrote it."""
    try:
        raw = safe_load(text)
    except YAMLProblem:
        return REDACTED  # never stored (the request is refused), but never shown either
    if not isinstance(raw, dict):
        return redact_urls(text)
    secrets = raw.get("secrets")
    envs = raw.get("envs")
    secret_envs = SECRET_ENV_NAMES & set(envs) if isinstance(envs, dict) else set()
    if not secrets and not secret_envs:
        return redact_urls(text)
    shown = dict(raw)
    if isinstance(secrets, dict):
        shown["secrets"] = dict.fromkeys(secrets, REDACTED)
    elif secrets:
        shown["secrets"] = REDACTED
    if secret_envs:
        assert isinstance(envs, dict)
        shown["envs"] = {k: REDACTED if k in secret_envs else v for k, v in envs.items()}
    dumped = yaml.safe_dump(shown, sort_keys=False, default_flow_style=False)
    return redact_urls("# secret values removed by clusterd\n" + dumped)


def public_args(args: dict[str, Any]) -> dict[str, Any]:
    """A request's arguments as they may be stored and shown: secret values replaced by their
    names, secret environment variables and URL credentials removed."""
    shown: dict[str, Any] = {}
    for key, value in args.items():
        if key in SECRET_FIELDS:
            value = sorted(value) if isinstance(value, dict) else REDACTED
        elif key == "envs" and isinstance(value, dict):
            value = redact_envs(value)
        elif key == "yaml_text" and isinstance(value, str):
            value = redact_task_yaml(value)
        else:
            value = redact_values(value)
        shown[key] = value
    return shown
