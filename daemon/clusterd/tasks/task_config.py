"""A task's `config:` (SkyPilot's per-task overrides of its config file). clusterd takes one
key from it, `kubernetes.pod_config` (merged into the task's pods after the config file's);
every other key is refused by name, since clusterd's settings live in its own config file.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.pod_config import PodConfigError, parse
from clusterd.tasks.common import TaskError
from clusterd.tasks.common import kind as _kind
from clusterd.tasks.spec import Resources

HINT = "put other settings in clusterd's config file (~/.config/clusterd/config.yaml)"


def task_pod_config(value: Any, source: str) -> str:
    """The task's pod_config as canonical JSON ("" for none)."""
    if value is None:
        return ""
    if not isinstance(value, dict):
        raise TaskError(source, "config", f"expected a map, got {_kind(value)}")
    for key in value:
        if key != "kubernetes":
            raise TaskError(source, f"config.{key}", "not supported per task: only "
                            "config.kubernetes.pod_config is", HINT)
    kubernetes = value.get("kubernetes") or {}
    if not isinstance(kubernetes, dict):
        raise TaskError(source, "config.kubernetes", f"expected a map, got {_kind(kubernetes)}")
    for key in kubernetes:
        if key != "pod_config":
            raise TaskError(source, f"config.kubernetes.{key}", "not supported per task: "
                            "only config.kubernetes.pod_config is", HINT)
    try:
        return parse(kubernetes.get("pod_config"), "config.kubernetes.pod_config")
    except PodConfigError as exc:
        raise TaskError(source, "", str(exc)) from None


def with_task_config(resources: Resources, choices: tuple[Resources, ...], value: Any,
                     source: str) -> tuple[Resources, tuple[Resources, ...]]:
    """The task's resources (and each alternative) with its `config:` applied."""
    fragment = task_pod_config(value, source)
    if not fragment:
        return resources, choices
    return (dataclasses.replace(resources, pod_config=fragment),
            tuple(dataclasses.replace(c, pod_config=fragment) for c in choices))
