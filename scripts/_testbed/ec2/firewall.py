"""Security groups, enforced: nftables rules in the bed's namespace that do to traffic what EC2
does with each instance's groups.

- Stateful: a connection that was let in may answer, and goes on after the rule that let it in
  is revoked (as EC2's tracked connections do).
- Ingress by protocol and port range, from a CIDR or from the members of a group (the private
  addresses of the instances that hold it now). Anything else to an instance is dropped, as
  EC2 drops it (no reset): a connect times out.
- Egress is open, and an instance's traffic to itself never leaves it.

The rules are a function of what the API says (`ruleset`), read from moto by a thread of the
controller and applied in one nft transaction when they change. It reads the API again within
POLL_S of any EC2 call that may change something (not a Describe or Get): the bed's endpoint
and the controller's own clients tell it of each call. So an authorize, a revoke, or an
instance starting or stopping takes effect within a second. What moto changes on its own
(an instance going from stopping to stopped) is read at least every IDLE_PASS_S. It used to
read the API every POLL_S whatever happened: two calls per region, four times a second, a
tenth of a core of the machine that the nodes share.

Traffic between two nodes of one bridge reaches the inet family's forward hook through bridge
netfilter; the daemon's traffic (it runs in the bed's namespace) goes through the output hook.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import subprocess
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from _testbed.ec2.regions import vpc_cidr

log = logging.getLogger("testbed.ec2.firewall")

TABLE = "clusterd_sg"
POLL_S = 0.25
IDLE_PASS_S = 2.0
READS = ("Describe", "Get")  # EC2 calls that change nothing
ANYWHERE = "0.0.0.0/0"
LIVE_STATES = ("pending", "running", "stopping", "shutting-down")


@dataclasses.dataclass(frozen=True)
class Member:
    """An instance as the firewall sees it: its address and its groups."""

    instance_id: str
    ip: str
    groups: tuple[str, ...]


def members_of(reservations: Iterable[Mapping[str, Any]]) -> list[Member]:
    """The instances of a DescribeInstances answer that have an address and are not stopped."""
    out = []
    for reservation in reservations:
        for inst in reservation.get("Instances", []):
            ip = inst.get("PrivateIpAddress")
            if not ip or inst.get("State", {}).get("Name") not in LIVE_STATES:
                continue
            groups = {g["GroupId"] for g in inst.get("SecurityGroups", [])}
            for nic in inst.get("NetworkInterfaces", []):
                groups |= {g["GroupId"] for g in nic.get("Groups", [])}
            out.append(Member(inst["InstanceId"], ip, tuple(sorted(groups))))
    return out


def _chain(instance_id: str) -> str:
    return "in_" + instance_id.replace("-", "_")


def _protocol_match(permission: Mapping[str, Any]) -> str | None:
    """The nft match for a permission's protocol and ports; "" for all traffic, None for
    nothing we can express (IPv6-only protocols)."""
    proto = str(permission.get("IpProtocol", "-1")).lower()
    low, high = permission.get("FromPort"), permission.get("ToPort")
    if proto in ("-1", "all"):
        return ""
    if proto in ("tcp", "6", "udp", "17"):
        name = "tcp" if proto in ("tcp", "6") else "udp"
        if low is None or int(low) == -1:
            return f"meta l4proto {name}"
        ports = str(low) if low == high else f"{low}-{high}"
        return f"{name} dport {ports}"
    if proto in ("icmp", "1"):
        match = "meta l4proto icmp"
        if low is not None and int(low) != -1:
            match = f"icmp type {int(low)}"
            if high is not None and int(high) != -1:
                match += f" icmp code {int(high)}"
        return match
    if proto.isdigit():
        return f"meta l4proto {int(proto)}"
    return None


def _sources(permission: Mapping[str, Any], by_group: Mapping[str, list[str]]) -> list[str]:
    """nft saddr matches: "" for anywhere; one per CIDR, and one for each source group's
    members (none when it has no member: that source lets nobody in)."""
    out = []
    for r in permission.get("IpRanges", []):
        cidr = r.get("CidrIp")
        if not cidr:
            continue
        network = ipaddress.IPv4Network(cidr, strict=False)
        out.append("" if str(network) == ANYWHERE else f"ip saddr {network}")
    for pair in permission.get("UserIdGroupPairs", []):
        ips = sorted(set(by_group.get(pair.get("GroupId", ""), [])),
                     key=ipaddress.IPv4Address)
        if ips:
            out.append("ip saddr { " + ", ".join(ips) + " }")
    return out


def ruleset(members: list[Member], permissions: Mapping[str, list[Mapping[str, Any]]],
            vpcs: list[str]) -> str:
    """The nft script (one transaction) for these instances, their groups' ingress
    permissions ({group id: IpPermissions}) and the bed's VPC CIDRs."""
    by_group: dict[str, list[str]] = {}
    for m in members:
        for g in m.groups:
            by_group.setdefault(g, []).append(m.ip)
    members = sorted(members, key=lambda m: ipaddress.IPv4Address(m.ip))
    chains = []
    for m in members:
        rules = []
        for group in m.groups:
            for permission in permissions.get(group, []):
                proto = _protocol_match(permission)
                if proto is None:
                    continue
                for source in _sources(permission, by_group):
                    rules.append(" ".join(x for x in (source, proto, "accept") if x))
        rules = [*dict.fromkeys(rules), "drop"]
        body = "".join(f"\t\t{r}\n" for r in rules)
        chains.append(f"\tchain {_chain(m.instance_id)} {{  # {m.ip} {','.join(m.groups)}\n"
                      f"{body}\t}}\n")
    dispatch = ""
    if members:
        dispatch = ("\t\tip daddr vmap { " + ", ".join(
            f"{m.ip} : jump {_chain(m.instance_id)}" for m in members) + " }\n")
    # An address of a VPC that no live instance holds (yet) is dropped too: nothing reaches
    # a node before its rules are in place.
    closed = ("\t\tip daddr { " + ", ".join(sorted(vpcs)) + " } drop\n") if vpcs else ""
    base = ("\t\tct state established,related accept\n"
            "\t\tct state invalid drop\n" + dispatch + closed)
    return (f"table inet {TABLE}\n"
            f"delete table inet {TABLE}\n"
            f"table inet {TABLE} {{\n"
            + "".join(chains)
            + "\tchain forward {\n\t\ttype filter hook forward priority filter; policy accept;\n"
            + base + "\t}\n"
            + "\tchain output {\n\t\ttype filter hook output priority filter; policy accept;\n"
            + "\t\toifname \"lo\" accept\n" + base + "\t}\n"
            + "}\n")


def apply(script: str) -> None:
    p = subprocess.run(["nft", "-f", "-"], input=script, capture_output=True, text=True,
                       timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"nft -f failed (exit {p.returncode}): {p.stderr.strip()[-1000:]}")


OFF = f"table inet {TABLE}\ndelete table inet {TABLE}\n"  # no rules: everything goes


class Firewall:
    """Keeps the bed's rules what the API says, from a thread of its own. regions() gives the
    bed's regions; api(region) a boto3 EC2 client to moto. With enforce off (`scripts/testbed
    ec2 firewall --off`, for measuring what enforcement costs) no rule stands."""

    def __init__(self, regions: Callable[[], list[str]], api: Callable[[str], Any]) -> None:
        self._regions = regions
        self._api = api
        self.enforce = True
        self._applied: str | None = None
        self._stop = threading.Event()
        self.generation = 0  # bumped at every change applied
        self.applied_at = 0.0
        self.syncs = 0  # passes finished (read the API, applied what changed)
        self._dirty = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="firewall", daemon=True)

    def start(self) -> None:
        self.sync()  # the first rules before any node boots
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=10)

    def status(self) -> dict[str, Any]:
        return {"enforce": self.enforce, "generation": self.generation,
                "applied_at": self.applied_at, "syncs": self.syncs,
                "rules": _instance_rules(self._applied or "")}

    def set_enforce(self, enforce: bool) -> None:
        self.enforce = enforce
        self.sync()

    def rules(self) -> str:
        return self._applied or ""

    def saw_call(self, service: str, action: str) -> None:
        """An API call was made (by anyone): read the API again soon if it may have changed
        something. A call whose service or action could not be read counts as a change."""
        if service in ("ec2", "") and not (action and action.startswith(READS)):
            self._dirty.set()

    def _loop(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(POLL_S):
            if not self._dirty.is_set() and time.monotonic() - last < IDLE_PASS_S:
                continue
            self._dirty.clear()  # before reading: a call during the pass makes another
            last = time.monotonic()
            try:
                self.sync()
            except Exception:
                log.exception("applying security groups failed")

    def sync(self) -> bool:
        """Read the API, apply the rules if they changed; True if they did."""
        members: list[Member] = []
        permissions: dict[str, list[Mapping[str, Any]]] = {}
        regions = list(self._regions())
        for region in regions:
            ec2 = self._api(region)
            reservations = ec2.describe_instances(Filters=[
                {"Name": "instance-state-name", "Values": list(LIVE_STATES)}])["Reservations"]
            members += members_of(reservations)
            for g in ec2.describe_security_groups()["SecurityGroups"]:
                permissions[g["GroupId"]] = g.get("IpPermissions", [])
        script = ruleset(members, permissions, [vpc_cidr(r) for r in regions]) \
            if self.enforce else OFF
        if script == self._applied:
            self.syncs += 1
            return False
        apply(script)
        self._applied = script
        self.generation += 1
        self.applied_at = time.time()
        self.syncs += 1
        log.info("security groups applied (generation %d): %d instance(s), %d rule(s)%s",
                 self.generation, len(members), _instance_rules(script),
                 "" if self.enforce else " (enforcement off)")
        return True


def _instance_rules(script: str) -> int:
    """The rules of the instances' chains (not the dispatching ones)."""
    return sum(1 for line in script.splitlines()
               if line.startswith("\t\t") and line.endswith(" accept") and "ct state" not in line
               and "oifname" not in line)
