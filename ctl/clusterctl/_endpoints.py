"""`status --ip CLUSTER`, `status --endpoints CLUSTER` and `status --endpoint PORT CLUSTER`
(SkyPilot's): the head node's address, and the task's ports (`resources.ports`) as URLs on
it. Imported only for those options."""

from __future__ import annotations

from clusterctl import _exit_codes, protocol
from clusterctl._fail import fail

TYPE_CHECKING = False  # typing, for the type checker alone: 2 ms of every clusterctl run
if TYPE_CHECKING:
    import argparse
    from collections.abc import Iterable
    from typing import Any

    from clusterctl.client import Client


def main(client: Client, args: argparse.Namespace) -> int:
    (name,) = args.clusters
    (view,) = protocol.views_of(client.call(protocol.StatusArgs(clusters=[name],
                                                               verbose=True))["clusters"])
    if view["status"] != "UP":
        fail(f"cluster {name} is {view['status']}: its nodes have no address now",
             f"start it: clusterctl start {name}")
    ip = head_ip(client.call(protocol.NodesArgs(cluster=name)).get("nodes", []), name)
    if args.ip:
        print(ip)
        return _exit_codes.SUCCEEDED
    ports = expand((view.get("resources") or {}).get("ports") or ())
    if not ports:
        fail(f"cluster {name} opens no ports", "give the task resources.ports (a port, a "
             "range '8000-8010', or a list) and launch it again")
    if args.endpoint is not None:
        if args.endpoint not in ports:
            fail(f"port {args.endpoint} is not one of cluster {name}'s ports "
                 f"({', '.join(map(str, ports))})")
        print(f"http://{ip}:{args.endpoint}")
        return _exit_codes.SUCCEEDED
    for port in ports:
        print(f"{port}: http://{ip}:{port}")
    return _exit_codes.SUCCEEDED


def head_ip(nodes: list[dict[str, Any]], name: str) -> str:
    """The head's address from outside its network where it has one (an EC2 instance's
    public IP, as SkyPilot's --ip), else its own."""
    head = next((n for n in nodes if n.get("role") == "head"), None)
    ip = head and (head.get("external_ip") or head.get("internal_ip"))
    if not ip:
        fail(f"cluster {name}'s head node has no address now",
             f"see `clusterctl status -r {name}`")
    return str(ip)


def expand(ports: Iterable[str | int]) -> list[int]:
    """`8080`, `"8000-8002"` → each port once, in order."""
    found: dict[int, None] = {}
    for item in ports:
        low, _, high = str(item).partition("-")
        found.update(dict.fromkeys(range(int(low), int(high or low) + 1)))
    return list(found)
