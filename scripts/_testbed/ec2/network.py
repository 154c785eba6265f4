"""The bed's network, seen from its namespace (the controller runs there, as root).

Every instance runs in a network namespace of its own (its node's `unshare --net`), joined by
a veth pair to its VPC's bridge in the bed's namespace:

    bed namespace:  lo 127.0.0.1/32   cdbrR 127.R.0.1/16 (one bridge per VPC 127.R.0.0/16)
                                        |- cdvXXXXXXXXXXXX (veth) -- eth0 127.R.Z.N/16 in the node
                                        `- ...

Loopback addresses route over veths and bridges once `lo` holds only 127.0.0.1/32 (not the
whole /8, which the kernel would answer locally) and route_localnet is on. A connection between
two nodes then carries the sender's own address, which is what security group rules match on
(firewall.py); the daemon, in the bed's namespace, reaches nodes from 127.R.0.1.

Nothing here reaches outside the bed's namespace: it holds only lo, its bridges and the bed-side
ends of its nodes' veths, and routes only 127/8 addresses and the metadata service's
link-local 169.254.169.254, which lives on the bed's lo. Kernel settings are set inside the
namespaces and go with them. Standard library only.
"""

from __future__ import annotations

import contextlib
import ipaddress
import logging
import os
import time

from _testbed.common import Failure, assert_loopback, run
from _testbed.ec2.imds import IMDS_IP
from _testbed.ec2.layout import SERVICE_IP
from _testbed.ec2.regions import REGION_NUMBERS, vpc_cidr

log = logging.getLogger("testbed.ec2.network")

NODE_LINK = "eth0"  # the node's end of its veth
# The bed's addresses that nodes reach through their gateway: the API (S3) and the instance
# metadata service, the one address here outside 127/8 (link-local: routed nowhere else).
NODE_SERVICES = (SERVICE_IP, IMDS_IP)
NETNS_WAIT_S = 5.0
# Per-namespace settings: 127/8 addresses may leave lo (route_localnet), and bridged IPv4
# passes the inet family's hooks (conntrack and the forward chain), which is how the firewall
# sees traffic between two nodes of one bridge. Both are per network namespace.
SYSCTLS = {
    "net/ipv4/conf/all/route_localnet": "1",
    "net/ipv4/conf/default/route_localnet": "1",
    "net/bridge/bridge-nf-call-iptables": "1",
}


def node_routes(ip: str, prefix: int) -> None:
    """From inside a node: the bed's services (the API, instance metadata) through the VPC's
    gateway, as EC2 routes them from an instance."""
    via = str(ipaddress.IPv4Network(f"{assert_loopback(ip)}/{prefix}", strict=False)[1])
    for service in NODE_SERVICES:
        # `src`: a 127/8 address has host scope, which the kernel never picks on its own as
        # the source towards another address.
        run(["ip", "route", "replace", f"{service}/32", "via", via, "dev", NODE_LINK,
             "src", ip])


def bridge_name(region: str) -> str:
    return f"cdbr{REGION_NUMBERS[region]}"


def gateway(region: str) -> str:
    """The bed's own address on a VPC's bridge (no subnet holds 127.R.0.0/24)."""
    return assert_loopback(str(ipaddress.IPv4Network(vpc_cidr(region))[1]))


def veth_name(instance_id: str) -> str:
    """The bed-side end of an instance's veth (15 characters at most, as the kernel wants)."""
    return "cdv" + instance_id.removeprefix("i-")[-12:]


def set_sysctl(name: str, value: str) -> None:
    """A kernel setting of the calling process's network namespace (/proc/sys/net is per
    namespace)."""
    with open(os.path.join("/proc/sys", name), "w") as f:
        f.write(value)


def loopback_only_localhost() -> None:
    """`lo` answers for 127.0.0.1 alone, so that other 127/8 addresses can live on links."""
    run(["ip", "link", "set", "lo", "up"])
    run(["ip", "addr", "replace", "127.0.0.1/32", "dev", "lo"])
    run(["ip", "addr", "del", "127.0.0.1/8", "dev", "lo"], check=False)  # gone already: fine


def setup_bed_namespace() -> None:
    """The bed's namespace, once, from its controller."""
    loopback_only_localhost()
    for ip in NODE_SERVICES:  # answered here, reached by nodes through their gateway
        run(["ip", "addr", "replace", f"{ip}/32", "dev", "lo"])
    for name, value in SYSCTLS.items():
        try:
            set_sysctl(name, value)
        except OSError as e:
            raise Failure(f"cannot set {name} in the bed's namespace: {e}",
                          hint="the kernel needs bridge netfilter (CONFIG_BRIDGE_NETFILTER)"
                          ) from e


def ensure_bridge(region: str) -> str:
    """The VPC's bridge, up, with the bed's address on it. Idempotent."""
    name = bridge_name(region)
    if not os.path.exists(f"/sys/class/net/{name}"):
        run(["ip", "link", "add", name, "type", "bridge"])
    set_sysctl(f"net/ipv4/conf/{name}/route_localnet", "1")
    prefix = ipaddress.IPv4Network(vpc_cidr(region)).prefixlen
    run(["ip", "addr", "replace", f"{gateway(region)}/{prefix}", "dev", name])
    run(["ip", "link", "set", name, "up"])
    return name


def wait_own_netns(pid: int, timeout: float = NETNS_WAIT_S) -> None:
    """Until pid (an `unshare --net` being started) is in a network namespace of its own."""
    ours = os.readlink("/proc/self/ns/net")
    deadline = time.monotonic() + timeout
    while True:
        try:
            if os.readlink(f"/proc/{pid}/ns/net") != ours:
                return
        except FileNotFoundError:
            raise Failure(f"process {pid} exited before it had a network namespace") from None
        if time.monotonic() > deadline:
            raise Failure(f"process {pid} had no network namespace of its own after {timeout}s")
        time.sleep(0.005)


def attach(instance_id: str, region: str, pid: int, link_up: bool) -> str:
    """Give the node whose namespace pid is in its end of a veth (as NODE_LINK; the node sets
    its address), and plug the other end into its VPC's bridge; down if link_up is False (a
    partition). Returns the bed-side name."""
    wait_own_netns(pid)
    name = veth_name(instance_id)
    delete_link(name)  # from an earlier boot whose namespace is not quite gone
    run(["ip", "link", "add", name, "type", "veth", "peer", "name", NODE_LINK, "netns", str(pid)])
    run(["ip", "link", "set", name, "master", ensure_bridge(region)])
    set_link(instance_id, link_up)
    return name


def set_link(instance_id: str, up: bool) -> bool:
    """Cut (down) or restore (up) an instance's link; False if it has none now."""
    name = veth_name(instance_id)
    if not os.path.exists(f"/sys/class/net/{name}"):
        return False
    run(["ip", "link", "set", name, "up" if up else "down"])
    return True


def forget_neighbour(ip: str) -> None:
    run(["ip", "neigh", "flush", "to", assert_loopback(ip)], check=False)


def delete_link(name: str) -> None:
    if os.path.exists(f"/sys/class/net/{name}"):
        with contextlib.suppress(Failure):
            run(["ip", "link", "del", name])


def interfaces() -> list[str]:
    """The interfaces of this namespace (the controller's /sys is the bed's: `ip netns exec`
    mounts it so)."""
    return sorted(os.listdir("/sys/class/net"))
