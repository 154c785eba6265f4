"""`ssh_node_pools.yaml`: pools of existing hosts, in SkyPilot's format.

    my-pool:
      user: ubuntu                   # defaults for the pool's hosts
      identity_file: ~/.ssh/id_ed25519
      port: 22
      strict_host_key_checking: true  # refuse hosts whose key ~/.ssh/known_hosts lacks
      price_per_hour: 0.5            # what one host costs per hour (cost reports; default 0)
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
import ipaddress
import os
import re
from pathlib import Path
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.safe_yaml import YAMLProblem, read_regular_file, safe_load

POOL_FIELDS = {"user", "identity_file", "port", "hosts", "password", "strict_host_key_checking",
               "price_per_hour"}
HOST_FIELDS = {"ip", "user", "identity_file", "port", "password", "strict_host_key_checking"}
MAX_POOLS_BYTES = 1024 * 1024
# Addresses and names end up in ssh's config and on command lines: a DNS name or an IP
# address, and a POSIX-ish user name; nothing that could be read as an option or a second line.
HOSTNAME = re.compile(r"^(?=.{1,253}$)[A-Za-z0-9_]([A-Za-z0-9_-]{0,62})"
                      r"(\.[A-Za-z0-9_]([A-Za-z0-9_-]{0,62}))*\.?$")
USER_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]{0,31}\$?$")


def valid_address(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
        return True
    except ValueError:
        return bool(HOSTNAME.fullmatch(text))


class PoolFileError(ProtocolError):
    def __init__(self, path: Path, field: str, message: str) -> None:
        super().__init__(
            ErrorCode.INVALID_ARGUMENT, f"{path}: {field}: {message}",
            "see the ssh_node_pools.yaml format in docs/providers.md",
        )


@dataclasses.dataclass(frozen=True)
class Pool:
    name: str
    hosts: tuple[SSHTarget, ...]
    price_per_hour: float = 0.0  # per host (clusterd/cost/prices.py)


def load_pools(path: Path) -> dict[str, Pool]:
    try:
        text = read_regular_file(str(path), MAX_POOLS_BYTES).decode("utf-8")
    except FileNotFoundError:
        return {}
    except (OSError, UnicodeDecodeError) as exc:
        raise PoolFileError(path, "(file)", f"cannot read: {exc}") from None
    try:
        raw = safe_load(text) or {}
    except YAMLProblem as exc:
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
    price = value.get("price_per_hour", 0.0)
    if not isinstance(price, int | float) or isinstance(price, bool) or not 0 <= price < 1e6:
        raise PoolFileError(path, f"{name}.price_per_hour",
                            f"expected dollars per host and hour, got {str(price)[:40]!r}")
    defaults = {k: value.get(k) for k in ("user", "identity_file", "port",
                                          "strict_host_key_checking")}
    targets = []
    for index, host in enumerate(hosts):
        field = f"{name}.hosts[{index}]"
        entry = {"ip": host} if isinstance(host, str) else host
        if not isinstance(entry, dict) or not isinstance(entry.get("ip"), str):
            raise PoolFileError(path, field, "expected an address, or a map with ip")
        _check_fields(path, field, entry, HOST_FIELDS)
        if not valid_address(entry["ip"]):
            raise PoolFileError(path, f"{field}.ip", f"not a host name or IP address: "
                                                     f"{entry['ip'][:80]!r}")
        merged = {**{k: v for k, v in defaults.items() if v is not None},
                  **{k: v for k, v in entry.items() if v is not None}}
        user = merged.get("user") or os.environ.get("USER") or "root"
        if not isinstance(user, str) or not USER_NAME.fullmatch(user):
            raise PoolFileError(path, f"{field}.user", f"not a user name: {str(user)[:80]!r}")
        port = merged.get("port", 22)
        if not isinstance(port, int) or isinstance(port, bool) or not 0 < port < 65536:
            raise PoolFileError(path, f"{field}.port", f"not a port number: {port!r}")
        identity = merged.get("identity_file")
        if identity is not None:
            if not isinstance(identity, str) or any(c in identity for c in '"\n\r\0'):
                raise PoolFileError(path, f"{field}.identity_file", "expected a file path")
            identity = os.path.expanduser(identity)
            if not os.path.exists(identity):
                raise PoolFileError(path, f"{field}.identity_file", f"{identity} does not exist")
        strict = merged.get("strict_host_key_checking", False)
        if not isinstance(strict, bool):
            raise PoolFileError(path, f"{field}.strict_host_key_checking",
                                f"expected true or false, got {str(strict)[:40]!r}")
        targets.append(SSHTarget(host=merged["ip"], port=port, user=str(user),
                                 identity_file=identity, strict_host_keys=strict))
    if len(set(targets)) != len(targets):
        raise PoolFileError(path, f"{name}.hosts", "lists a host twice")
    return Pool(name, tuple(targets), float(price))
