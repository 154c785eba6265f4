"""`pod_config` (SkyPilot's field, under `kubernetes:` in the config file, or per task under
`config: kubernetes:`): a fragment of a Pod manifest merged into every pod clusterd makes.

Maps are merged key by key (the fragment's value wins for a scalar); lists are appended
(tolerations, volumes, imagePullSecrets, env, volumeMounts), and the fragment's one container
(`spec.containers[0]`) is merged into clusterd's. What would break clusterd is refused by
name: the container's command, image, ports or probe (clusterd runs sshd there), a second
container, the pod's restart policy or host name, clusterd's own labels, and volume, mount or
variable names clusterd uses itself.
"""

from __future__ import annotations

import copy
import json
from typing import Any

MAX_BYTES = 64 * 1024
# Pod fields clusterd sets and relies on: where a pod_config sets them, it is refused.
_REFUSED_SPEC = {
    "restartPolicy": "a pod that ended is a node lost; it must not restart by itself",
    "hostname": "the pod's host name is its node name in the cluster",
    "containers": "",  # checked by _check_container
    "initContainers": "",  # allowed; listed so the loop below leaves it alone
}
_REFUSED_CONTAINER = {
    "name": "clusterd names its container",
    "image": "set the image as kubernetes.image, or image_id: docker:IMAGE in the task",
    "command": "the container runs the image's entrypoint, which starts sshd",
    "args": "the container runs the image's entrypoint, which starts sshd",
    "ports": "clusterd's SSH port is the container's",
    "readinessProbe": "clusterd waits on sshd with its own probe",
}
# Resources the task's cpus, memory and accelerators set.
_TASK_RESOURCES = {"cpu", "memory", "nvidia.com/gpu"}


class PodConfigError(ValueError):
    """A pod_config clusterd refuses: the message names the field and says why."""


def parse(value: Any, where: str) -> str:
    """A pod_config as read from YAML, checked, as canonical JSON ("" for none)."""
    if value is None or value == {}:
        return ""
    if not isinstance(value, dict):
        raise PodConfigError(f"{where}: expected a map (a fragment of a Pod manifest)")
    try:
        text = json.dumps(value, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise PodConfigError(f"{where}: not plain data: {exc}") from None
    if len(text) > MAX_BYTES:
        raise PodConfigError(f"{where}: larger than {MAX_BYTES // 1024} KB")
    check(value, where)
    return text


def check(fragment: dict[str, Any], where: str) -> None:
    for key in fragment:
        if key not in ("metadata", "spec"):
            raise PodConfigError(f"{where}.{key}: a pod_config has metadata and spec only")
    metadata = fragment.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise PodConfigError(f"{where}.metadata: expected a map")
    for key in metadata:
        if key not in ("labels", "annotations"):
            raise PodConfigError(f"{where}.metadata.{key}: only labels and annotations can "
                                 "be set (clusterd names its pods)")
        items = metadata[key] or {}
        if not isinstance(items, dict):
            raise PodConfigError(f"{where}.metadata.{key}: expected a map")
        for name in items:
            if str(name).startswith("clusterd-"):
                raise PodConfigError(f"{where}.metadata.{key}.{name}: clusterd's own "
                                     f"{key[:-1]}; it finds its pods by them")
    spec = fragment.get("spec") or {}
    if not isinstance(spec, dict):
        raise PodConfigError(f"{where}.spec: expected a map")
    for key, why in _REFUSED_SPEC.items():
        if key in spec and why:
            raise PodConfigError(f"{where}.spec.{key}: clusterd sets it: {why}")
    for key in ("volumes", "tolerations", "imagePullSecrets", "initContainers"):
        if key in spec and not isinstance(spec[key], list):
            raise PodConfigError(f"{where}.spec.{key}: expected a list")
    containers = spec.get("containers") or []
    if not isinstance(containers, list):
        raise PodConfigError(f"{where}.spec.containers: expected a list")
    if len(containers) > 1:
        raise PodConfigError(f"{where}.spec.containers: one container only (merged into "
                             "clusterd's); clusterd runs no sidecars")
    if containers:
        _check_container(containers[0], f"{where}.spec.containers[0]")


def _check_container(container: Any, where: str) -> None:
    if not isinstance(container, dict):
        raise PodConfigError(f"{where}: expected a map")
    for key, why in _REFUSED_CONTAINER.items():
        if key in container:
            raise PodConfigError(f"{where}.{key}: clusterd sets it: {why}")
    for key in ("env", "volumeMounts"):
        if key in container and not isinstance(container[key], list):
            raise PodConfigError(f"{where}.{key}: expected a list")
    resources = container.get("resources") or {}
    if not isinstance(resources, dict):
        raise PodConfigError(f"{where}.resources: expected a map")
    for kind in ("requests", "limits"):
        taken = _TASK_RESOURCES & set(resources.get(kind) or {})
        if taken:
            raise PodConfigError(f"{where}.resources.{kind}.{sorted(taken)[0]}: the task's "
                                 "resources (cpus, memory, accelerators) set it")


def merge(pod: dict[str, Any], text: str) -> dict[str, Any]:
    """The pod with the pod_config (canonical JSON, as parse made it) merged in. Names the
    pod uses already (volumes, mounts, variables) are refused, not overwritten."""
    if not text:
        return pod
    fragment = json.loads(text)
    out = copy.deepcopy(pod)
    spec = dict(fragment.get("spec") or {})
    containers = spec.pop("containers", None) or []
    _merge_into(out.setdefault("metadata", {}), fragment.get("metadata") or {}, "metadata")
    _merge_into(out["spec"], spec, "spec")
    if containers:
        _merge_into(out["spec"]["containers"][0], containers[0], "spec.containers[0]")
    return out


_NAMED_LISTS = {"volumes", "volumeMounts", "env", "imagePullSecrets"}


def _merge_into(ours: dict[str, Any], theirs: dict[str, Any], where: str) -> None:
    for key, value in theirs.items():
        here = ours.get(key)
        if isinstance(here, dict) and isinstance(value, dict):
            _merge_into(here, value, f"{where}.{key}")
        elif isinstance(here, list) and isinstance(value, list):
            if key in _NAMED_LISTS:
                names = {item.get("name") for item in here if isinstance(item, dict)}
                clash = next((item["name"] for item in value if isinstance(item, dict)
                              and item.get("name") in names), None)
                if clash is not None:
                    raise PodConfigError(f"pod_config: {where}.{key}: {clash!r} is in the "
                                         "pod already (clusterd's own, or an earlier "
                                         "pod_config's); choose another name")
            here.extend(copy.deepcopy(value))
        else:
            ours[key] = copy.deepcopy(value)
