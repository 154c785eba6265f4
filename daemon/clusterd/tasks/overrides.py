"""The command line's overrides of a loaded task, in one place: `launch`/`exec` apply them when
a task arrives, and a managed job again when it loads its task anew after a daemon restart.

They work as SkyPilot's flags do (its CLI's `_parse_override_params` and
`Task.set_resources_override`): a resource flag replaces that field in the task's resources
and in each of its alternatives (`any_of`/`ordered`), parsed exactly as the task file's field
is; the word `none` clears the field; `--workdir` replaces the task's workdir; `--no-setup`
drops its setup. One table says which flag stands for which task field: the daemon applies
it, and docs/skypilot-compatibility.md lists it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from clusterd.tasks.common import TaskError
from clusterd.tasks.loader import parse_resources, parse_workdir
from clusterd.tasks.spec import Resources, TaskSpec


@dataclasses.dataclass(frozen=True)
class Override:
    flag: str  # as the user types it
    key: str  # the task file's `resources` key it stands for
    fields: tuple[str, ...]  # the Resources fields it sets
    example: str


# By the wire's argument name (ops.RunArgs; `cpus` is every task's, TaskArgs).
RESOURCE_OVERRIDES: dict[str, Override] = {
    "cpus": Override("--cpus", "cpus", ("cpus", "cpus_at_least"), "`4`, `4+`"),
    "memory": Override("--memory", "memory", ("memory_gb", "memory_at_least"), "`32`, `32+`"),
    "gpus": Override("--gpus", "accelerators", ("accelerator", "accelerator_count"),
                     "`A100:2`, `A100` (one)"),
    "instance_type": Override("--instance-type", "instance_type", ("instance_type",),
                              "`m6i.large`"),
    "use_spot": Override("--use-spot / --no-use-spot", "use_spot", ("use_spot",), ""),
    "disk_size": Override("--disk-size", "disk_size", ("disk_size_gb",), "`100` (GB)"),
    "ports": Override("--ports", "ports", ("ports",),
                      "`8080`, `10000-10010` (repeatable; replaces the task's list)"),
    "image_id": Override("--image-id", "image_id", ("image_id", "region_images"),
                         "`ami-...`, `docker:IMAGE`"),
}
CLEAR = "none"


def apply_overrides(task: TaskSpec, *, num_nodes: int | None = None, name: str | None = None,
                    cpus: str | None = None, resources: Mapping[str, Any] | None = None,
                    workdir: str | None = None, cwd: str = "/", no_setup: bool = False
                    ) -> TaskSpec:
    """The task with the command line's overrides; `resources` maps RESOURCE_OVERRIDES'
    names to what was given (None: not given)."""
    changes: dict[str, Any] = {}
    if num_nodes is not None:
        changes["num_nodes"] = num_nodes
    if name:
        changes["name"] = name
    if workdir is not None:
        changes["workdir"] = parse_workdir(workdir, "--workdir", cwd, task.envs)
    if no_setup:
        changes["setup"] = None
    given = {k: v for k, v in {"cpus": cpus, **(resources or {})}.items() if v is not None}
    if given:
        values = resource_values(given)

        def overridden(resources: Resources) -> Resources:
            return dataclasses.replace(resources, **values)

        choices = tuple(dict.fromkeys(overridden(r) for r in task.resource_choices))
        # Alternatives the override made one (any_of: [A100, H100] with --gpus V100) are one.
        changes["resources"] = choices[0] if len(choices) == 1 else overridden(task.resources)
        changes["resource_choices"] = choices if len(choices) > 1 else ()
    return dataclasses.replace(task, **changes) if changes else task


def resource_values(given: Mapping[str, Any]) -> dict[str, Any]:
    """The Resources fields the given overrides set, each parsed as its task field is."""
    values: dict[str, Any] = {}
    for argument, value in given.items():
        override = RESOURCE_OVERRIDES[argument]
        parsed = (Resources() if _clears(value, override)
                  else parse_resources({override.key: value}, override.flag))
        values.update({name: getattr(parsed, name) for name in override.fields})
    return values


def _clears(value: Any, override: Override) -> bool:
    """`none` clears a field, as in SkyPilot; among other ports it is a mistake."""
    words = value if isinstance(value, list) else [value]
    cleared = [w for w in words if isinstance(w, str) and w.strip().lower() == CLEAR]
    if cleared and len(words) > 1:
        raise TaskError(override.flag, "", "`none` clears the field: give it alone")
    return bool(cleared)


def cli_markdown() -> list[str]:
    """The compatibility page's section on the command line (see fields.markdown)."""
    lines = [
        "## Command-line flags",
        "",
        "`clusterctl launch` and `exec` take SkyPilot's flags. Each resource flag replaces "
        "that field of the task file's `resources`, and of each of its `any_of`/`ordered` "
        "alternatives, as SkyPilot's do; it is read as the field is, and `none` clears the "
        "field. On `exec` they are the job's demands, which the cluster must meet. (This "
        "section is made from the table in `daemon/clusterd/tasks/overrides.py`.)",
        "",
        "| Flag | Task field | Examples |",
        "|---|---|---|",
    ]
    lines += [f"| `{o.flag}` | `resources.{o.key}` | {o.example or '-'} |"
              for o in RESOURCE_OVERRIDES.values()]
    lines += [
        "| `--num-nodes` | `num_nodes` | `2` |",
        "| `--name` | `name` | |",
        "| `--workdir DIR` | `workdir` | a local directory (relative to where you run "
        "clusterctl) |",
        "| `--env K=V`, `--env K` | `envs` | repeatable; a bare name takes this shell's value |",
        "| `--env-file FILE` | `envs` | dotenv lines `K=V` (`export`, quotes and `#` comments "
        "allowed); `--env` wins over it |",
        "| `--secret K=V` | `secrets` | |",
        "| `--no-setup` | `setup` | launch: the setup is skipped |",
        "",
        "And: `--dryrun` prints the plan (the cluster's step: new, reuse, start...; the chosen "
        "placement, its instance type and price per hour from the catalog; the other places "
        "in the order they would be tried; what would be synced, with sizes) and makes "
        "nothing: no cluster record, no request, no instance (`--json`: the plan as a JSON "
        "object). `-r` is `--retry-until-up`. `-y/--yes` is accepted (launch never asks). "
        "`--fast` is accepted: a relaunch of an UP cluster with the same resources already "
        "skips provisioning and the runtime's set-up (it only checks them); `--no-setup` "
        "skips the setup too.",
        "",
    ]
    return lines
