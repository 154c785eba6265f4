"""`ssh_node_pools.yaml`: pools of existing hosts, in SkyPilot's format.

    my-pool:
      user: ubuntu                   # defaults for the pool's hosts
      identity_file: ~/.ssh/id_ed25519
      port: 22
      hosts:
        - 10.0.0.5                   # just an address
        - ip: 10.0.0.6               # or with its own settings
          user: alice
          identity_file: ~/.ssh/alice
          port: 2222

Errors name the file and the field.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

import yaml

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.providers.base import SSHTarget

POOL_FIELDS = {"user", "identity_file", "port", "hosts", "password"}
HOST_FIELDS = {"ip", "user", "identity_file", "port", "password"}


class PoolFileError(ProtocolError):
    def __init__(self, path: Path, field: str, message: str) -> None:
        super().__init__(
            ErrorCode.INVALID_ARGUMENT, f"{path}: {field}: {message}",
            "see the ssh_node_pools.yaml format in README",
        )


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    hosts: tuple[SSHTarget, ...]


def load_pools(path: Path) -> dict[str, Pool]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return {}
    try:
        raw = yaml.safe_load(text) or {}
    except yaml.YAMLError as exc:
        raise PoolFileError(path, "(file)", f"not valid YAML: {exc}") from None
    if not isinstance(raw, dict):
        raise PoolFileError(path, "(file)", "expected a map of pool name to pool")
    return {str(name): _pool(path, str(name), value) for name, value in raw.items()}


def _check_fields(path: Path, where: str, value: dict[str, Any], known: set[str]) -> None:
    unknown = set(value) - known
    if unknown:
        raise PoolFileError(path, f"{where}.{sorted(unknown)[0]}", "unknown field")
    if "password" in value:
        raise PoolFileError(path, f"{where}.password",
                            "password login is not supported; use identity_file")


def _pool(path: Path, name: str, value: Any) -> Pool:
    if not isinstance(value, dict):
        raise PoolFileError(path, name, "expected a map with hosts")
    _check_fields(path, name, value, POOL_FIELDS)
    hosts = value.get("hosts")
    if not isinstance(hosts, list) or not hosts:
        raise PoolFileError(path, f"{name}.hosts", "expected a non-empty list of hosts")
    defaults = {k: value.get(k) for k in ("user", "identity_file", "port")}
    targets = []
    for index, host in enumerate(hosts):
        field = f"{name}.hosts[{index}]"
        entry = {"ip": host} if isinstance(host, str) else host
        if not isinstance(entry, dict) or not isinstance(entry.get("ip"), str):
            raise PoolFileError(path, field, "expected an address, or a map with ip")
        _check_fields(path, field, entry, HOST_FIELDS)
        merged = {**{k: v for k, v in defaults.items() if v is not None},
                  **{k: v for k, v in entry.items() if v is not None}}
        user = merged.get("user") or os.environ.get("USER") or "root"
        port = merged.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise PoolFileError(path, f"{field}.port", f"not a port number: {port!r}")
        identity = merged.get("identity_file")
        if identity is not None:
            identity = os.path.expanduser(str(identity))
            if not os.path.exists(identity):
                raise PoolFileError(path, f"{field}.identity_file", f"{identity} does not exist")
        targets.append(SSHTarget(host=merged["ip"], port=port, user=str(user),
                                 identity_file=identity))
    if len(set(targets)) != len(targets):
        raise PoolFileError(path, f"{name}.hosts", "lists a host twice")
    return Pool(name, tuple(targets))
