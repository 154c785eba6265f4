"""Load SkyPilot task YAML (or an inline command) into a TaskSpec.

Every error names the file and the field, e.g. ``train.yaml: resources.cpus: expected a number
or a string like '4+', got a list``.
"""

from __future__ import annotations

import dataclasses
import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from clusterctl.protocol import WAIT_FOR_CHOICES, ErrorCode, ProtocolError, clipped
from clusterd.node_shared import containers
from clusterd.redact import SECRET_ENV_NAMES
from clusterd.safe_yaml import YAMLProblem, count_documents, read_regular_file, safe_load
from clusterd.tasks import fields
from clusterd.tasks.buckets import is_bucket_url, parse_bucket_mount
from clusterd.tasks.common import TaskError
from clusterd.tasks.common import expand as _expand
from clusterd.tasks.common import kind as _kind
from clusterd.tasks.common import local_path as _local_path
from clusterd.tasks.common import shown as _shown
from clusterd.tasks.spec import (
    Autostop,
    BucketMount,
    GitWorkdir,
    Infra,
    Resources,
    TaskSpec,
)
from clusterd.tasks.task_config import with_task_config

MAX_TASK_BYTES = 4 * 1024 * 1024
# SkyPilot's lists of alternatives: any of them (cheapest first), or in the user's order.
CHOICE_FIELDS = ("any_of", "ordered")
DISK_TIERS = ("low", "medium", "high", "ultra", "best")
NETWORK_TIERS = ("standard", "best")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# Beyond these a number is a mistake (or an attack), not a request.
MAX_NUM_NODES = 1000
MAX_CPUS = 10_000.0
MAX_MEMORY_GB = 1_000_000.0
MAX_ACCELERATORS = 1024.0
MAX_DISK_GB = 65_536
# Ten years: "never" is `autostop: false`.
MAX_IDLE_MINUTES = 10 * 365 * 24 * 60.0
MAX_LABELS = 256
MAX_PORTS = 1024


def _scalar(value: Any) -> bool:
    return isinstance(value, str | int | float | bool)


def load_task(
    *,
    yaml_path: str | None = None,
    yaml_text: str | None = None,
    command: str | None = None,
    source: str = "<task>",
    cwd: str = "/",
    env_overrides: Mapping[str, str] | None = None,
    secret_overrides: Mapping[str, str] | None = None,
) -> TaskSpec:
    given = [x for x in (yaml_path, yaml_text, command) if x is not None]
    if len(given) != 1:
        raise ProtocolError(
            ErrorCode.INVALID_ARGUMENT,
            "give exactly one of a task YAML path, YAML text or a command",
        )
    if command is not None:
        if not command.strip():
            raise TaskError(source, "", "the command is empty")
        raw: Any = {"run": command}
        source = "<command>"
    else:
        if yaml_path is not None:
            source = yaml_path
            yaml_text = _read(Path(os.path.join(cwd, yaml_path)), source)
        assert yaml_text is not None
        if len(yaml_text.encode()) > MAX_TASK_BYTES:
            raise TaskError(source, "", f"task file is larger than {MAX_TASK_BYTES} bytes")
        try:
            raw = safe_load(yaml_text)
        except YAMLProblem as exc:
            documents = count_documents(yaml_text)
            if documents > 1:
                raise TaskError(
                    source, "", f"is a SkyPilot pipeline of {documents} tasks (documents "
                    "separated by ---); clusterd runs one task at a time",
                    "put each task in a file of its own and run them in turn with "
                    "`clusterctl launch` (then `clusterctl exec`)") from None
            raise TaskError(source, "", f"not valid YAML: {exc}") from None
        if raw is None:
            raw = {}
        if not isinstance(raw, dict):
            raise TaskError(source, "", f"a task must be a map of fields, got {_kind(raw)}")
    return _build(raw, source, cwd, env_overrides or {}, secret_overrides or {})


def _read(path: Path, source: str) -> str:
    """The task file's text; never blocks (a FIFO or device is refused)."""
    try:
        if path.stat().st_size > MAX_TASK_BYTES:
            raise TaskError(source, "", f"task file is larger than {MAX_TASK_BYTES} bytes")
        return read_regular_file(str(path), MAX_TASK_BYTES).decode("utf-8")
    except FileNotFoundError:
        raise TaskError(source, "", "file not found") from None
    except IsADirectoryError:
        raise TaskError(source, "", "is a directory, not a task YAML") from None
    except UnicodeDecodeError:
        raise TaskError(source, "", "is not UTF-8 text") from None
    except OSError as exc:
        raise TaskError(source, "", f"cannot read: {exc.strerror or exc}") from None


def _build(
    raw: dict[Any, Any],
    source: str,
    cwd: str,
    env_overrides: Mapping[str, str],
    secret_overrides: Mapping[str, str],
) -> TaskSpec:
    warnings = _check_fields(raw, "", source)
    name = _optional_str(raw, "name", source)
    if name is not None and not name.strip():
        name = None
    run = _script(raw, "run", source)
    setup = _script(raw, "setup", source)
    num_nodes = raw.get("num_nodes", 1)
    if (not isinstance(num_nodes, int) or isinstance(num_nodes, bool)
            or not 1 <= num_nodes <= MAX_NUM_NODES):
        raise TaskError(source, "num_nodes", f"must be a whole number from 1 to "
                                             f"{MAX_NUM_NODES}, got {_shown(num_nodes)}")
    resources, choices, ordered, more = parse_task_resources(raw.get("resources"), source)
    warnings += more
    resources, choices = with_task_config(resources, choices, raw.get("config"), source)
    envs = _env_map(raw, "envs", source, env_overrides, "--env")
    secrets = _env_map(raw, "secrets", source, secret_overrides, "--secret")
    for secret in SECRET_ENV_NAMES & envs.keys():
        # A secret wherever it was written: the job still sees it, nothing stores it.
        secrets.setdefault(secret, envs.pop(secret))
    file_mounts, bucket_mounts = _file_mounts(raw.get("file_mounts"), source, cwd, envs)
    return TaskSpec(
        name=name,
        run=run,
        setup=setup,
        num_nodes=num_nodes,
        resources=resources,
        resource_choices=choices,
        choices_ordered=ordered,
        workdir=parse_workdir(raw.get("workdir"), source, cwd, envs),
        file_mounts=file_mounts,
        bucket_mounts=bucket_mounts,
        envs=envs,
        secrets=secrets,
        source=source,
        warnings=tuple(warnings),
    )


def _check_fields(raw: Mapping[Any, Any], prefix: str, source: str,
                  where: str | None = None) -> list[str]:
    """Refuse what clusterd refuses (by name, saying why) and what is unknown (with what is
    known); the warnings for what it accepts without effect. `prefix` names the fields in
    the table, `where` (default: the same) names them in messages."""
    table = fields.children(prefix)
    where = prefix if where is None else where
    warnings = []
    for key in raw:
        path = f"{where}.{key}" if where else str(key)
        field = table.get(key) if isinstance(key, str) else None
        if field is None:
            raise TaskError(source, _shown_path(path), "unknown field",
                            f"known fields: {', '.join(fields.known_names(prefix))}")
        if field.support == fields.Support.PLANNED:
            raise TaskError(source, path, f"not supported yet: {field.note}")
        if field.support == fields.Support.REFUSED:
            raise TaskError(source, path, f"not supported: {field.note}")
        if field.support == fields.Support.WARNED:
            warnings.append(f"{path}: has no effect: {field.note}")
    return warnings


def _shown_path(path: str) -> str:
    return clipped(path, 80)


def _optional_str(raw: Mapping[Any, Any], key: str, source: str,
                  field: str | None = None) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str | int | float) or isinstance(value, bool):
        raise TaskError(source, field or key, f"expected a string, got {_kind(value)}")
    return str(value)


def _script(raw: Mapping[Any, Any], key: str, source: str) -> str | None:
    value = raw.get(key)
    if value is None:
        return None
    if not isinstance(value, str):
        raise TaskError(source, key, f"expected a shell script (a string), got {_kind(value)}")
    return value if value.strip() else None


def _env_map(
    raw: Mapping[Any, Any],
    key: str,
    source: str,
    overrides: Mapping[str, str],
    flag: str,
) -> dict[str, str]:
    value = raw.get(key) or {}
    if not isinstance(value, dict):
        raise TaskError(source, key, f"expected a map of NAME: value, got {_kind(value)}")
    result: dict[str, str | None] = {}
    for name, item in value.items():
        if not isinstance(name, str) or not ENV_NAME.fullmatch(name):
            raise TaskError(source, f"{key}.{name}", "is not a valid environment variable name")
        if isinstance(item, dict | list):
            raise TaskError(source, f"{key}.{name}", f"expected a string, got {_kind(item)}")
        if isinstance(item, bool):
            item = "true" if item else "false"
        result[name] = None if item is None else str(item)
    for name, item in overrides.items():
        if not ENV_NAME.fullmatch(name):
            raise TaskError(source, f"{flag} {name}", "is not a valid environment variable name")
        result[name] = item
    missing = sorted(n for n, v in result.items() if v is None)
    if missing:
        raise TaskError(
            source, f"{key}.{missing[0]}", "has no value",
            f"pass it with {flag} {missing[0]} (the value comes from your environment, "
            "never the command line)" if flag == "--secret"
            else f"pass it with {flag} {missing[0]}=VALUE",
        )
    return {n: v for n, v in result.items() if v is not None}


def _number(value: Any, source: str, field: str, what: str,
            limit: float) -> tuple[float, bool]:
    """`4`, `4.5`, `"4"`, `"4+"` → (4.0, at_least); positive, finite and at most `limit`."""
    if isinstance(value, bool):
        raise TaskError(source, field, f"expected {what}, got a boolean")
    if isinstance(value, int | float):
        amount, at_least = float(value), False
    elif isinstance(value, str):
        text = value.strip()
        at_least = text.endswith("+")
        text = text.rstrip("+").strip()
        if what == "a size in GB":
            text = re.sub(r"(?i)\s*gb?$", "", text)
        try:
            amount = float(text)
        except ValueError:
            raise TaskError(source, field, f"expected {what} or a string like '4+', "
                                           f"got {_shown(value)}") from None
    else:
        raise TaskError(source, field, f"expected {what} or a string like '4+', "
                                       f"got {_kind(value)}")
    if not math.isfinite(amount) or amount <= 0:
        raise TaskError(source, field, f"must be a positive number, got {_shown(value)}")
    if amount > limit:
        raise TaskError(source, field, f"must be at most {limit:g}, got {_shown(value)}")
    return amount, at_least


def _accelerators(value: Any, source: str, prefix: str = "resources"
                  ) -> list[tuple[str | None, float]]:
    """`A100:8`, `{A100: 8}`; several (`{H100: 8, H200: 8}`, or a list of either form) are
    alternatives, as SkyPilot means them: any of them will do."""
    field = f"{prefix}.accelerators"
    if value is None:
        return [(None, 0)]
    if isinstance(value, list):
        if not value:
            raise TaskError(source, field, "the list of accelerators is empty")
        found = [one for item in value for one in _accelerators(item, source, prefix)]
    elif isinstance(value, dict):
        if not value:
            raise TaskError(source, field, "expected {NAME: COUNT}, like {A100: 1}")
        found = [_one_accelerator(name, 1 if count is None else count, value, source, field)
                 for name, count in value.items()]
    elif isinstance(value, str):
        name, _, count_text = value.partition(":")
        found = [_one_accelerator(name, count_text or 1, value, source, field)]
    else:
        raise TaskError(source, field, f"expected a string like 'A100:1', got {_kind(value)}")
    return list(dict.fromkeys(found))


def _one_accelerator(name: Any, count: Any, value: Any, source: str,
                     field: str) -> tuple[str | None, float]:
    if not _scalar(name) or not _scalar(count) or isinstance(count, bool):
        raise TaskError(source, field, "expected {NAME: COUNT}, like {A100: 1}")
    try:
        amount = float(count)
    except (TypeError, ValueError):
        raise TaskError(source, field, f"count must be a number, got {_shown(count)}") from None
    if (not math.isfinite(amount) or not 0 < amount <= MAX_ACCELERATORS
            or not str(name).strip()):
        raise TaskError(source, field, f"expected a name and a positive count (at most "
                                       f"{MAX_ACCELERATORS:g}), got {_shown(value)}")
    return str(name).strip(), amount


def parse_autostop(value: Any, source: str, field: str = "resources.autostop") -> Autostop | None:
    """SkyPilot's forms: `true`, `false`, minutes, or `{idle_minutes, down, wait_for}`."""
    if value is None or value is False:
        return None
    if value is True:
        return Autostop(idle_minutes=5)
    if isinstance(value, int | float | str) and not isinstance(value, bool):
        minutes, _ = _number(value, source, field, "minutes", MAX_IDLE_MINUTES)
        return Autostop(idle_minutes=minutes)
    if isinstance(value, dict):
        _check_fields(value, "resources.autostop", source, where=field)
        minutes = value.get("idle_minutes", 5)
        minutes_value, _ = _number(minutes, source, f"{field}.idle_minutes", "minutes",
                                   MAX_IDLE_MINUTES)
        down = value.get("down", False)
        if not isinstance(down, bool):
            raise TaskError(source, f"{field}.down", f"expected true or false, got {down!r}")
        wait_for = value.get("wait_for", "jobs_and_ssh")
        if not isinstance(wait_for, str) or wait_for not in WAIT_FOR_CHOICES:
            raise TaskError(source, f"{field}.wait_for",
                            f"must be one of {', '.join(WAIT_FOR_CHOICES)}, "
                            f"got {_shown(wait_for)}")
        return Autostop(minutes_value, down, wait_for)
    raise TaskError(source, field, f"expected true, minutes or a map, got {_kind(value)}")


def parse_task_resources(value: Any, source: str
                         ) -> tuple[Resources, tuple[Resources, ...], bool, list[str]]:
    """`resources`: the base; its alternatives (SkyPilot's `any_of` or `ordered`, each merged
    over the base, and several accelerators, any of which will do), whether their order is
    the user's, and the warnings for fields accepted without effect."""
    if value is None:
        return Resources(), (), False, []
    if not isinstance(value, dict):
        raise TaskError(source, "resources", f"expected a map, got {_kind(value)}")
    value = _unaliased(value, source, "resources")
    warnings = _check_fields(value, "resources", source)
    keys = [k for k in CHOICE_FIELDS if k in value]
    if not keys:
        options = _with_accelerators(value, source, "resources")
        if len(options) == 1:
            return options[0], (), False, warnings
        return _base(value, source), tuple(options), False, warnings
    if len(keys) == 2:
        raise TaskError(source, "resources", "give any_of or ordered, not both")
    key = keys[0]
    items = value[key]
    if not isinstance(items, list) or not items:
        raise TaskError(source, f"resources.{key}", "expected a non-empty list of resources")
    base = {k: v for k, v in value.items() if k != key}
    choices: list[Resources] = []
    for index, item in enumerate(items):
        field = f"resources.{key}[{index}]"
        if not isinstance(item, dict):
            raise TaskError(source, field, f"expected a map of resources, got {_kind(item)}")
        item = _unaliased(item, source, field)
        warnings += _check_fields(item, "resources", source, where=field)
        merged = dict(base)
        if "infra" in item:  # an alternative's place replaces the base's, in either form
            for legacy in ("cloud", "region", "zone"):
                merged.pop(legacy, None)
        if any(k in item for k in ("cloud", "region", "zone")):
            merged.pop("infra", None)
        merged.update(item)
        choices += _with_accelerators(merged, source, field)
    return _base(base, source), tuple(dict.fromkeys(choices)), key == "ordered", warnings


def _unaliased(value: dict[Any, Any], source: str, where: str) -> dict[Any, Any]:
    """SkyPilot's alias: `gpus` is `accelerators`."""
    if "gpus" not in value:
        return value
    if "accelerators" in value:
        raise TaskError(source, f"{where}.gpus", "give accelerators or gpus (its alias), not "
                                                 "both")
    return {("accelerators" if k == "gpus" else k): v for k, v in value.items()}


def _with_accelerators(raw: dict[Any, Any], source: str, where: str) -> list[Resources]:
    """The resources, once per accelerator they accept."""
    plain = parse_resources({k: v for k, v in raw.items() if k != "accelerators"}, source,
                            where)
    return [dataclasses.replace(plain, accelerator=name, accelerator_count=count)
            for name, count in _accelerators(raw.get("accelerators"), source, where)]


def _base(raw: dict[Any, Any], source: str) -> Resources:
    """The resources shared by every alternative (their one accelerator, if one)."""
    options = _with_accelerators(raw, source, "resources")
    return options[0] if len(options) == 1 else dataclasses.replace(options[0],
                                                                    accelerator=None,
                                                                    accelerator_count=0)


def parse_resources(value: Any, source: str, prefix: str = "resources") -> Resources:
    if value is None:
        return Resources()
    if not isinstance(value, dict):
        raise TaskError(source, prefix, f"expected a map, got {_kind(value)}")
    for key in value:
        if key in CHOICE_FIELDS:
            raise TaskError(source, f"{prefix}.{key}", "alternatives cannot be nested")
    if prefix != "resources":  # the top level was checked by parse_task_resources
        _check_fields(value, "resources", source, where=prefix)
    infra_text = value.get("infra")
    if infra_text is not None and not isinstance(infra_text, str):
        raise TaskError(source, f"{prefix}.infra", f"expected a string like 'aws/us-east-1', "
                                                   f"got {_kind(infra_text)}")
    legacy = [value.get(k) for k in ("cloud", "region", "zone")]
    for key, item in zip(("cloud", "region", "zone"), legacy, strict=True):
        if item is not None and not isinstance(item, str):
            raise TaskError(source, f"resources.{key}", f"expected a name, got {_kind(item)}")
    if infra_text and any(legacy):
        raise TaskError(source, f"{prefix}.infra", "give either infra or cloud/region/zone")
    if any(legacy):
        cloud, region, zone = (str(v) if v else None for v in legacy)
        infra = Infra(cloud.lower() if cloud else None, region, zone)
    else:
        infra = Infra.parse(infra_text)
    cpus = memory = None
    cpus_plus = memory_plus = False
    if value.get("cpus") is not None:
        cpus, cpus_plus = _number(value["cpus"], source, f"{prefix}.cpus", "a number", MAX_CPUS)
    if value.get("memory") is not None:
        memory, memory_plus = _number(value["memory"], source, f"{prefix}.memory",
                                      "a size in GB", MAX_MEMORY_GB)
    choices = _accelerators(value.get("accelerators"), source, prefix)
    if len(choices) > 1:
        raise TaskError(source, f"{prefix}.accelerators", "name one accelerator here")
    ((accelerator, count),) = choices
    disk_tier = _choice(value, "disk_tier", DISK_TIERS, source, prefix)
    _choice(value, "network_tier", NETWORK_TIERS, source, prefix)
    max_cost = value.get("max_hourly_cost")
    if max_cost is not None:
        max_cost, _ = _number(max_cost, source, f"{prefix}.max_hourly_cost", "dollars",
                              1_000_000.0)
    ports = _ports(value.get("ports"), source, prefix)
    disk = value.get("disk_size")
    if disk is not None and (not isinstance(disk, int) or isinstance(disk, bool)
                             or not 0 < disk <= MAX_DISK_GB):
        raise TaskError(source, f"{prefix}.disk_size", f"expected GB as a whole number from 1 "
                                                       f"to {MAX_DISK_GB}, got {_shown(disk)}")
    use_spot = value.get("use_spot", False)
    if not isinstance(use_spot, bool):
        raise TaskError(source, f"{prefix}.use_spot", f"expected true or false, got {use_spot!r}")
    image_id, region_images = _image_id(value.get("image_id"), source, prefix)
    labels = value.get("labels") or {}
    if not isinstance(labels, dict):
        raise TaskError(source, f"{prefix}.labels", f"expected a map, got {_kind(labels)}")
    if len(labels) > MAX_LABELS:
        raise TaskError(source, f"{prefix}.labels", f"at most {MAX_LABELS} labels")
    for key, item in labels.items():
        if not isinstance(key, str) or not _scalar(item):
            raise TaskError(source, f"{prefix}.labels.{_shown(key, 40)}",
                            f"expected NAME: value (a string), got {_kind(item)}")
    return Resources(
        infra=infra,
        cpus=cpus,
        cpus_at_least=cpus_plus,
        memory_gb=memory,
        memory_at_least=memory_plus,
        accelerator=accelerator,
        accelerator_count=count,
        instance_type=_optional_str(value, "instance_type", source, f"{prefix}.instance_type"),
        use_spot=use_spot,
        disk_size_gb=disk,
        ports=ports,
        image_id=image_id,
        region_images=region_images,
        labels=tuple(sorted((str(k), str(v)) for k, v in labels.items())),
        autostop=parse_autostop(value.get("autostop"), source, f"{prefix}.autostop"),
        disk_tier=disk_tier,
        max_hourly_cost=max_cost,
    )


def _choice(value: Mapping[Any, Any], key: str, allowed: tuple[str, ...], source: str,
            prefix: str) -> str | None:
    item = value.get(key)
    if item is None:
        return None
    if not isinstance(item, str) or item.lower() not in allowed:
        raise TaskError(source, f"{prefix}.{key}",
                        f"must be one of {', '.join(allowed)}, got {_shown(item)}")
    return item.lower()


PORT_RANGE = re.compile(r"^(\d{1,5})(?:-(\d{1,5}))?$")


def _ports(value: Any, source: str, prefix: str = "resources") -> tuple[str, ...]:
    """`8080`, `"8000-8010"`, or a list of those; each a port (or range) from 1 to 65535."""
    field = f"{prefix}.ports"
    if value is None:
        return ()
    items = [value] if _scalar(value) else value
    if not isinstance(items, list):
        raise TaskError(source, field, f"expected a port, range or list, got {_kind(value)}")
    if len(items) > MAX_PORTS:
        raise TaskError(source, field, f"at most {MAX_PORTS} ports or ranges")
    ports = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise TaskError(source, field, f"expected a port or a range like '8000-8010', "
                                           f"got {_kind(item)}")
        text = str(item).strip()
        match = PORT_RANGE.fullmatch(text)
        low, high = (int(match[1]), int(match[2] or match[1])) if match else (0, 0)
        if not match or not 1 <= low <= high <= 65535:
            raise TaskError(source, field, f"{_shown(item)} is not a port (1-65535) or a "
                                           "range of them")
        ports.append(text)
    return tuple(ports)


def _image_id(value: Any, source: str, prefix: str = "resources"
              ) -> tuple[str | None, tuple[tuple[str, str], ...]]:
    """An image for every region, or a map of region to image (which also limits where the
    cluster can go)."""
    field = f"{prefix}.image_id"
    if value is None:
        return None, ()
    if isinstance(value, dict):
        if not value:
            raise TaskError(source, field, "the map of region to image is empty")
        pairs = []
        for region, image in value.items():
            if not isinstance(region, str) or not isinstance(image, str) or not image.strip():
                raise TaskError(source, f"{field}.{region}", "expected an image id")
            pairs.append((region, image.strip()))
        return None, tuple(sorted(pairs))
    if isinstance(value, str) and value.strip():
        image_id = value.strip()
        if image_id.startswith(containers.DOCKER_PREFIX):
            try:
                containers.check_image(image_id[len(containers.DOCKER_PREFIX):])
            except containers.BadImage as exc:
                raise TaskError(source, field, f"docker:IMAGE: {exc}") from None
        return image_id, ()
    raise TaskError(source, field, f"expected an image id or a map of region to image id, "
                                   f"got {_kind(value)}")


def parse_workdir(value: Any, source: str, cwd: str,
                  envs: Mapping[str, str]) -> str | GitWorkdir | None:
    """`workdir`: a local directory (made absolute against `cwd`), or a git {url, ref}."""
    if value is None:
        return None
    if isinstance(value, dict):
        unknown = set(value) - {"url", "ref"}
        if unknown:
            raise TaskError(source, f"workdir.{sorted(unknown)[0]}", "unknown field")
        url = value.get("url")
        if not isinstance(url, str) or not url.strip():
            raise TaskError(source, "workdir.url", "a git workdir needs a url")
        if url.startswith("-") or any(c.isspace() for c in url):
            raise TaskError(source, "workdir.url", "not a repository URL (it starts with '-' "
                                                   "or holds spaces)")
        ref = value.get("ref")
        if ref is not None and not isinstance(ref, str | int | float):
            raise TaskError(source, "workdir.ref", f"expected a branch, tag or commit, "
                                                   f"got {_kind(ref)}")
        ref_text = None if ref is None else str(ref)
        if ref_text is not None and (not ref_text or ref_text.startswith("-")
                                     or any(c.isspace() or c == "\0" for c in ref_text)):
            raise TaskError(source, "workdir.ref", f"{_shown(ref_text)} is not a branch, tag "
                                                   "or commit (it is empty, starts with '-' or "
                                                   "holds spaces)")
        return GitWorkdir(url, ref_text)
    if not isinstance(value, str):
        raise TaskError(source, "workdir", f"expected a path or {{url, ref}}, got {_kind(value)}")
    path = _local_path(_expand(value, envs), cwd)
    if not os.path.isdir(path):
        raise TaskError(source, "workdir", f"{path} is not a directory")
    return path


def _file_mounts(value: Any, source: str, cwd: str, envs: Mapping[str, str]
                 ) -> tuple[dict[str, str], tuple[BucketMount, ...]]:
    """(local paths by remote path, bucket entries)."""
    if value is None:
        return {}, ()
    if not isinstance(value, dict):
        raise TaskError(source, "file_mounts", f"expected a map of remote: local, "
                                               f"got {_kind(value)}")
    mounts: dict[str, str] = {}
    buckets: list[BucketMount] = []
    for written, local in value.items():
        field = f"file_mounts.{written}"
        remote = _expand(written, envs) if isinstance(written, str) else written
        if not isinstance(remote, str) or not remote.strip() or remote.startswith("-") or any(
                c in remote for c in "\n\r\0"):
            raise TaskError(source, "file_mounts", f"{_shown(remote)} is not a path (empty, "
                                                   "starting with '-', or on several lines)")
        if isinstance(local, dict) or (isinstance(local, str) and is_bucket_url(local)):
            buckets.append(parse_bucket_mount(remote, local, source, cwd, envs))
            continue
        if not isinstance(local, str):
            raise TaskError(source, field, f"expected a local path, an s3:// URL or a map "
                                           f"{{name, source, mode, ...}}, got {_kind(local)}")
        path = _local_path(_expand(local, envs), cwd)
        if not os.path.exists(path):
            raise TaskError(source, field, f"{path} does not exist")
        mounts[remote] = path
    return mounts, tuple(buckets)
