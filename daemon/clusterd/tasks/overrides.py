"""The command line's overrides of a loaded task (`--num-nodes`, `--name`, `--cpus`), in one
place: `launch`/`exec` apply them when a task arrives, and a managed job again when it loads
its task anew after a daemon restart."""

from __future__ import annotations

import dataclasses
from typing import Any

from clusterd.tasks.loader import parse_resources
from clusterd.tasks.spec import Resources, TaskSpec


def apply_overrides(task: TaskSpec, *, num_nodes: int | None = None, name: str | None = None,
                    cpus: str | None = None) -> TaskSpec:
    changes: dict[str, Any] = {}
    if num_nodes is not None:
        changes["num_nodes"] = num_nodes
    if name:
        changes["name"] = name
    if cpus is not None:
        parsed = parse_resources({"cpus": cpus}, "--cpus")

        def with_cpus(resources: Resources) -> Resources:
            return dataclasses.replace(resources, cpus=parsed.cpus,
                                       cpus_at_least=parsed.cpus_at_least)

        changes["resources"] = with_cpus(task.resources)
        changes["resource_choices"] = tuple(with_cpus(r) for r in task.resource_choices)
    return dataclasses.replace(task, **changes) if changes else task
