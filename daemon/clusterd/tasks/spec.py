"""Tasks as typed data: what a SkyPilot task YAML (or an inline command) asks for."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any

# A job that names no CPUs takes half a CPU per node, as SkyPilot's jobs do, so a few small
# jobs share a node while a job that asks for whole CPUs waits for them.
DEFAULT_JOB_CPUS = 0.5


@dataclasses.dataclass(frozen=True)
class Infra:
    """Where to run: `provider[/region[/zone]]`; for ssh the region is the pool name and for
    kubernetes the context."""

    provider: str | None = None
    region: str | None = None
    zone: str | None = None

    @classmethod
    def parse(cls, text: str | None) -> Infra:
        if not text or text == "*":
            return cls()
        parts = [p if p not in ("", "*") else None for p in text.strip().split("/")]
        provider = parts[0].lower() if parts[0] else None
        if provider == "k8s":
            provider = "kubernetes"
        # Kubernetes contexts may contain '/', so keep the rest whole.
        if provider == "kubernetes" and len(parts) > 1:
            return cls(provider, "/".join(p or "" for p in parts[1:]) or None, None)
        region = parts[1] if len(parts) > 1 else None
        zone = "/".join(p or "" for p in parts[2:]) or None if len(parts) > 2 else None
        return cls(provider, region, zone)

    def __str__(self) -> str:
        parts = [self.provider or "*", self.region or "*", self.zone or "*"]
        while len(parts) > 1 and parts[-1] == "*":  # "aws/*/us-east-1a" keeps its "*"
            parts.pop()
        return "/".join(parts)


@dataclasses.dataclass(frozen=True)
class Autostop:
    idle_minutes: float
    down: bool = False
    wait_for: str = "jobs_and_ssh"


@dataclasses.dataclass(frozen=True)
class Resources:
    """Per-node resources. `cpus`/`memory_gb` with `*_at_least` mean "N+" in SkyPilot terms."""

    infra: Infra = dataclasses.field(default_factory=Infra)
    cpus: float | None = None
    cpus_at_least: bool = False
    memory_gb: float | None = None
    memory_at_least: bool = False
    accelerator: str | None = None
    accelerator_count: float = 0
    instance_type: str | None = None
    use_spot: bool = False
    disk_size_gb: int | None = None
    ports: tuple[str, ...] = ()
    image_id: str | None = None
    # `image_id` as a map: region -> image, which also limits where the cluster can go.
    region_images: tuple[tuple[str, str], ...] = ()
    labels: tuple[tuple[str, str], ...] = ()
    autostop: Autostop | None = None
    disk_tier: str | None = None  # low, medium, high, ultra, best (SkyPilot's tiers)
    max_hourly_cost: float | None = None  # per node and hour, as the place is priced
    # The task's `config: kubernetes: pod_config:` as canonical JSON ("" for none).
    pod_config: str = ""

    @property
    def job_cpus(self) -> float:
        return self.cpus if self.cpus is not None else DEFAULT_JOB_CPUS

    def display(self, num_nodes: int) -> str:
        parts = [f"CPU:{_num(self.job_cpus)}"]
        if self.memory_gb:
            parts.append(f"mem:{_num(self.memory_gb)}GB")
        if self.accelerator:
            parts.append(f"{self.accelerator}:{_num(self.accelerator_count)}")
        return f"{num_nodes}x[{', '.join(parts)}]"

    def provisioning_view(self) -> dict[str, Any]:
        """The fields that decide which nodes a cluster gets (not how a job uses them)."""
        view = dataclasses.asdict(self)
        view.pop("autostop")
        view["infra"] = str(self.infra)
        return view

    @classmethod
    def from_view(cls, view: dict[str, Any]) -> Resources:
        """The inverse of `provisioning_view` (as stored in a cluster record)."""
        values = {k: v for k, v in view.items() if k in _RESOURCE_FIELDS}
        values["infra"] = Infra.parse(values.get("infra"))
        values["ports"] = tuple(values.get("ports") or ())
        values["labels"] = tuple(tuple(pair) for pair in values.get("labels") or ())
        values["region_images"] = tuple(tuple(pair) for pair in
                                        values.get("region_images") or ())
        return cls(**values)


_RESOURCE_FIELDS = frozenset(f.name for f in dataclasses.fields(Resources))


@dataclasses.dataclass(frozen=True)
class ResourceRequest:
    """What a cluster was asked for, as its record keeps it: the task's resources and its
    alternatives (SkyPilot's `any_of` / `ordered`), each already merged over them."""

    resources: Resources = dataclasses.field(default_factory=Resources)
    choices: tuple[Resources, ...] = ()
    ordered: bool = False  # the choices in the user's order, not cheapest first

    def options(self) -> tuple[Resources, ...]:
        """What the cluster can run on: its alternatives, or its one set of resources."""
        return self.choices or (self.resources,)

    def view(self) -> dict[str, Any]:
        """As `status -v` shows it, the config hash covers it and the record stores it."""
        view = self.resources.provisioning_view()
        if self.choices:
            view["choices"] = [r.provisioning_view() for r in self.choices]
            view["choices_ordered"] = self.ordered
        return view

    @classmethod
    def from_view(cls, view: dict[str, Any]) -> ResourceRequest:
        """The inverse of `view` (keys it does not know are ignored)."""
        return cls(Resources.from_view(view),
                   tuple(Resources.from_view(v) for v in view.get("choices") or ()),
                   bool(view.get("choices_ordered")))


def _num(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


@dataclasses.dataclass(frozen=True)
class GitWorkdir:
    url: str
    ref: str | None = None


@dataclasses.dataclass(frozen=True)
class BucketMount:
    """A `file_mounts` entry backed by an S3 bucket (SkyPilot's storage mounts).

    COPY puts the objects under `prefix` on every node before setup; MOUNT mounts the prefix
    with FUSE, so writes reach the bucket; MOUNT_CACHED mounts it with a local write cache that
    is uploaded asynchronously and flushed before the job is reported finished."""

    remote: str  # the path on the nodes
    bucket: str
    prefix: str = ""  # a key prefix without a leading '/'; "" is the whole bucket
    mode: str = "MOUNT"  # COPY | MOUNT | MOUNT_CACHED
    local_source: str | None = None  # a local directory uploaded to the bucket first
    create: bool = False  # named without an s3:// source: made if it does not exist
    persistent: bool = True  # False: a bucket clusterd made is deleted with the cluster

    @property
    def url(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}" if self.prefix else f"s3://{self.bucket}"


@dataclasses.dataclass(frozen=True)
class TaskSpec:
    name: str | None = None
    run: str | None = None
    setup: str | None = None
    num_nodes: int = 1
    resources: Resources = dataclasses.field(default_factory=Resources)
    # SkyPilot's `any_of` / `ordered`: alternatives (each merged over `resources`); with
    # `choices_ordered`, tried in the user's order, else cheapest first.
    resource_choices: tuple[Resources, ...] = ()
    choices_ordered: bool = False
    workdir: str | GitWorkdir | None = None  # local paths are absolute once loaded
    file_mounts: dict[str, str] = dataclasses.field(default_factory=dict)  # remote -> local
    bucket_mounts: tuple[BucketMount, ...] = ()
    envs: dict[str, str] = dataclasses.field(default_factory=dict)
    secrets: dict[str, str] = dataclasses.field(default_factory=dict)
    source: str = "<task>"
    # Fields accepted without effect, each naming the field and why (shown by launch/exec).
    warnings: tuple[str, ...] = ()

    def resource_options(self) -> tuple[Resources, ...]:
        """What the task can run on: its alternatives, or its one set of resources."""
        return self.resource_choices or (self.resources,)

    def request(self) -> ResourceRequest:
        """The resources asked for, as a cluster record keeps them."""
        return ResourceRequest(self.resources, self.resource_choices, self.choices_ordered)

    def config_hash(self) -> str:
        """Identifies the cluster this task needs: same hash, same nodes, nothing to provision."""
        view = {"num_nodes": self.num_nodes, "resources": self.request().view()}
        return hashlib.sha256(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]

    def public_view(self) -> dict[str, Any]:
        """For records and status: everything but secret values."""
        view = dataclasses.asdict(self)
        view["secrets"] = sorted(self.secrets)
        view["resources"]["infra"] = str(self.resources.infra)
        return view
