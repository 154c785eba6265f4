"""Every field of a SkyPilot task file, and what clusterd does with it: the one table.

The loader reads it (unknown fields, refusals, warnings), the launch reads it (fields that
apply on some providers only), and docs/skypilot-compatibility.md is made from it
(`scripts/gen-docs`; a test keeps them equal),
so the three cannot disagree. Nothing in a task file is dropped without a word: a field is
honoured, or refused by name, or accepted with a warning that names it and says why it has no
effect (`--strict` turns those warnings into refusals).

Where a field applies on some providers only (Support.SOME), each provider says whether it
honours it (`honoured_fields` on its class); the row says what the field does, and what
becomes of it on the others.
"""

from __future__ import annotations

import dataclasses
import enum
from collections.abc import Callable, Collection, Mapping

from clusterd.tasks.spec import Resources


class Support(enum.StrEnum):
    HONOURED = "honoured"
    SOME = "honoured on some providers"
    WARNED = "accepted with a warning (no effect)"
    REFUSED = "refused"
    PLANNED = "refused (planned)"


@dataclasses.dataclass(frozen=True)
class Field:
    path: str  # "resources.disk_tier"
    support: Support
    note: str  # what clusterd does with it: one line, for the docs and for messages
    # With Support.SOME: on a provider that does not honour it, it is `elsewhere`, saying why.
    elsewhere: Support = Support.WARNED
    why_elsewhere: str = ""

    @property
    def name(self) -> str:
        return self.path.rsplit(".", 1)[-1]


FIELDS: tuple[Field, ...] = (
    # -- the task ------------------------------------------------------------------------
    Field("name", Support.HONOURED, "the job's name"),
    Field("workdir", Support.HONOURED,
          "a local directory synced to ~/sky_workdir (.skyignore, else .gitignore), or a git "
          "repository {url, ref}; ${VAR} is filled from envs"),
    Field("num_nodes", Support.HONOURED, "nodes of the cluster, and of each job"),
    Field("resources", Support.HONOURED, "per-node resources (below)"),
    Field("envs", Support.HONOURED, "the job's environment; --env overrides, and fills nulls"),
    Field("secrets", Support.HONOURED,
          "like envs, but never stored, logged or shown; --secret overrides"),
    Field("file_mounts", Support.HONOURED,
          "local files and directories copied to every node; S3 buckets: `s3://b/p` is "
          "copied (COPY), `{name, source, store: s3, mode: MOUNT | COPY | MOUNT_CACHED, "
          "persistent}` is mounted (rclone) or copied, a bucket named without an s3:// "
          "source is made if missing, and a `persistent: false` one clusterd made goes with "
          "the cluster (or with its managed job); EC2 nodes reach them through an "
          "instance profile; other stores are refused; ${VAR} is filled from envs"),
    Field("setup", Support.HONOURED, "run on every node before the job (launch only)"),
    Field("run", Support.HONOURED, "run on every node, with the SKYPILOT_* environment"),
    Field("volumes", Support.PLANNED, "SkyPilot volumes are not offered yet"),
    Field("config", Support.SOME,
          "per-task overrides of SkyPilot's config: `kubernetes.pod_config` only (merged "
          "into the pods after the config file's); any other key is refused: put it in "
          "clusterd's config file (~/.config/clusterd/config.yaml)",
          Support.WARNED, "pod_config applies to Kubernetes pods only"),
    Field("service", Support.REFUSED, "SkyServe services are not something clusterd runs"),
    Field("pool", Support.REFUSED, "SkyPilot worker pools are not something clusterd runs"),
    Field("experimental", Support.REFUSED, "SkyPilot's experimental overrides"),
    Field("event_callback", Support.REFUSED, "SkyPilot's event callbacks"),
    Field("inputs", Support.WARNED,
          "a hint to SkyPilot's optimizer about data transfer; clusterd has no such optimizer"),
    Field("outputs", Support.WARNED,
          "a hint to SkyPilot's optimizer about data transfer; clusterd has no such optimizer"),
    # -- resources -----------------------------------------------------------------------
    Field("resources.infra", Support.HONOURED,
          "provider[/region[/zone]]: local, ssh/POOL, aws, aws/REGION, aws/REGION/ZONE, "
          "kubernetes, kubernetes/CONTEXT"),
    Field("resources.cloud", Support.HONOURED, "the older form of infra (with region, zone)"),
    Field("resources.region", Support.HONOURED, "with cloud: the region"),
    Field("resources.zone", Support.HONOURED, "with cloud: the zone"),
    Field("resources.accelerators", Support.HONOURED,
          "NAME:COUNT, {NAME: COUNT}; several (a map or a list) are alternatives, tried "
          "cheapest first"),
    Field("resources.gpus", Support.HONOURED, "SkyPilot's alias of accelerators"),
    Field("resources.accelerator_args", Support.WARNED,
          "arguments for TPUs (runtime_version, tpu_name, ...), which no provider here offers"),
    Field("resources.cpus", Support.HONOURED, "vCPUs per node: 4 exactly, 4+ at least"),
    Field("resources.memory", Support.HONOURED, "GiB per node: 32 exactly, 32+ at least"),
    Field("resources.instance_type", Support.SOME, "the instance type to launch",
          Support.REFUSED, "there are no instance types to choose from"),
    Field("resources.use_spot", Support.SOME, "spot instances (cheaper, may be preempted)",
          Support.WARNED, "these machines are not spot instances"),
    Field("resources.job_recovery", Support.WARNED,
          "how a managed job recovers (strategy FAILOVER or EAGER_NEXT_REGION, "
          "max_restarts_on_errors); read by "
          "`clusterctl jobs launch`, without effect on `launch` and `exec`"),
    Field("resources.spot_recovery", Support.WARNED,
          "the old name of job_recovery; read by `clusterctl jobs launch`, without effect on "
          "`launch` and `exec`"),
    Field("resources.disk_size", Support.SOME, "GB of the root disk (default 256)",
          Support.WARNED, "the disks of these machines are what they are"),
    Field("resources.disk_tier", Support.SOME,
          "low, medium (the default), high, ultra, best: the EBS volume type and IOPS, as "
          "SkyPilot sets them (standard; gp3 3,500; gp3 7,000; io2 20,000)",
          Support.WARNED, "the disks of these machines are what they are"),
    Field("resources.network_tier", Support.WARNED,
          "SkyPilot's high-performance networking (GPUDirect, EFA) is not set up by clusterd"),
    Field("resources.max_hourly_cost", Support.HONOURED,
          "places costing more per node and hour (the catalog's, an ssh pool's "
          "`price_per_hour`, `kubernetes.pricing`) are not tried; `local` costs nothing"),
    Field("resources.image_id", Support.SOME,
          "aws: an AMI, or a map of region to AMI (which also limits the regions); "
          "kubernetes: docker:IMAGE is the pods' image; docker:IMAGE elsewhere: the job "
          "runs in that container where the node has a container runtime (docker, podman)",
          Support.REFUSED,
          "a machine image cannot apply to machines that exist already (docker:IMAGE can)"),
    Field("resources.ports", Support.SOME,
          "aws: opened in the cluster's security group; kubernetes: a NodePort Service on "
          "the head pod",
          Support.WARNED,
          "clusterd keeps no firewall in front of these hosts (nothing to open)"),
    Field("resources.labels", Support.SOME,
          "aws: tags on the instances and their volumes; kubernetes: labels on the pods",
          Support.WARNED, "there is nothing to label"),
    Field("resources.autostop", Support.HONOURED,
          "true, minutes, or {idle_minutes, down, wait_for}"),
    Field("resources.autostop.idle_minutes", Support.HONOURED, "idle minutes before stopping"),
    Field("resources.autostop.down", Support.HONOURED, "tear down instead of stopping"),
    Field("resources.autostop.wait_for", Support.HONOURED,
          "jobs_and_ssh (default), jobs, or none"),
    Field("resources.autostop.hook", Support.PLANNED,
          "a script to run before autostop is not offered yet"),
    Field("resources.autostop.hook_timeout", Support.PLANNED,
          "a script to run before autostop is not offered yet"),
    Field("resources.any_of", Support.HONOURED,
          "alternatives (each merged over the rest), tried cheapest first"),
    Field("resources.ordered", Support.HONOURED, "alternatives, tried in the order given"),
)

BY_PATH: dict[str, Field] = {f.path: f for f in FIELDS}


def children(prefix: str) -> dict[str, Field]:
    """The fields directly under `prefix` ("" for the task itself), by name."""
    depth = prefix.count(".") + 1 if prefix else 0
    return {f.name: f for f in FIELDS if f.path.count(".") == depth
            and (f.path.startswith(prefix + ".") if prefix else True)}


def known_names(prefix: str) -> list[str]:
    """What may be written under `prefix`: every field clusterd honours there."""
    return sorted(name for name, f in children(prefix).items()
                  if f.support in (Support.HONOURED, Support.SOME, Support.WARNED))


# Whether a task asks for a field that applies on some providers only (by what it set).
_ASKED: dict[str, Callable[[Resources], bool]] = {
    "resources.instance_type": lambda r: r.instance_type is not None,
    "resources.use_spot": lambda r: r.use_spot,
    "resources.disk_size": lambda r: r.disk_size_gb is not None,
    "resources.disk_tier": lambda r: r.disk_tier is not None,
    # docker:IMAGE applies wherever the node has a container runtime (checked on the node).
    "resources.image_id": lambda r: bool(r.region_images) or bool(
        r.image_id and not r.image_id.startswith("docker:")),
    "resources.ports": lambda r: bool(r.ports),
    "resources.labels": lambda r: bool(r.labels),
    "config": lambda r: bool(r.pod_config),
}


# What a refusal under --strict (or `strict: true`) tells the user to do.
STRICT_HINT = ("refused under --strict (or strict: true in the config); drop the field, or run "
               "without --strict to take it as a warning")


def on_provider(resources: Resources, provider: str, honoured: Collection[str],
                strict: bool = False) -> tuple[list[str], list[str]]:
    """What the fields a task set mean on `provider`, which honours the fields in `honoured`
    (its `honoured_fields`): warnings (accepted, no effect there) and refusals (they cannot
    apply there), each naming the field and saying why. With `strict`, the warnings are
    refusals too (marked so). Both a new launch (of each provider it may try) and a task sent
    to an existing cluster (of that cluster's provider) ask this."""
    warnings, refusals = [], []
    for path, asked in _ASKED.items():
        field = BY_PATH[path]
        if not asked(resources) or path in honoured:
            continue
        if field.elsewhere == Support.REFUSED:
            refusals.append(f"{path}: cannot apply on {provider}: {field.why_elsewhere}")
        else:
            warnings.append(f"{path}: has no effect on {provider}: {field.why_elsewhere}")
    if strict:
        return [], refusals + [f"{w} (refused: strict)" for w in warnings]
    return warnings, refusals


def markdown(honoured: Mapping[str, Collection[str]]) -> str:
    """The compatibility page, with `honoured`: provider name -> the fields it honours."""
    lines = [
        "# SkyPilot task files in clusterd",
        "",
        "clusterd reads SkyPilot's task YAML. Every field SkyPilot defines is listed here with "
        "what clusterd does with it; nothing is dropped without a word. A field *accepted with "
        "a warning* has no effect here: the launch (or exec) prints a warning naming it and "
        "records an event, and `--strict` (or `strict: true` in the config file) refuses it "
        "instead.",
        "",
        "This page is generated from the table in `daemon/clusterd/tasks/fields.py` "
        "(`scripts/gen-docs`), which the loader and its error messages also read.",
        "",
        "| Field | clusterd | What it does |",
        "|---|---|---|",
    ]
    for field in FIELDS:
        support = str(field.support)
        note = field.note
        if field.support == Support.SOME:
            where = sorted(name for name, paths in honoured.items() if field.path in paths)
            support = f"honoured on {', '.join(where)}"
            note += f". Elsewhere {field.elsewhere.value.split(' (')[0]}: {field.why_elsewhere}"
        lines.append(f"| `{field.path}` | {support} | {note} |")
    lines += [
        "",
        "Multi-document files (SkyPilot pipelines, tasks separated by `---`) are refused with "
        "what the file holds: run each task with `clusterctl launch` or `exec` in turn.",
        "",
        "## Environment variables",
        "",
        "Every job's setup and run see SkyPilot's variables, with SkyPilot's formats:",
        "",
        "| Variable | Value |",
        "|---|---|",
        "| `SKYPILOT_NODE_RANK` | this node's rank, 0 on the head |",
        "| `SKYPILOT_NODE_IPS` | the job's nodes' IPs, one per line, head first |",
        "| `SKYPILOT_NUM_NODES` | how many nodes the job runs on |",
        "| `SKYPILOT_NUM_GPUS_PER_NODE` | accelerators per node the job asked for (0 if none) |",
        "| `SKYPILOT_TASK_ID` | `sky-YYYY-MM-DD-HH-MM-SS-micros_CLUSTER_JOBID` |",
        "| `SKYPILOT_CLUSTER_INFO` | JSON: `cluster_name`, `cloud` (`AWS`, `Kubernetes`, "
        "`SSH`, `Local`), `region` and `zone` (null where the provider has none), `num_nodes` |",
        "| `SKYPILOT_USER` | who submitted the job |",
        "| `SKYPILOT_SETUP_NODE_RANK`, `SKYPILOT_SETUP_NODE_IPS` | in setup: as above |",
        "",
    ]
    return "\n".join(lines)

