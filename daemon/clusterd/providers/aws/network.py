"""What a cluster's instances need around them: the key pair, the VPC and subnet they go in,
and a security group of their own, removed with the cluster.

The group lets in SSH and the task's ports from anywhere, and everything from its own members:
on EC2 a security group also governs traffic between the instances that share it, and Ray's
GCS, object manager and worker ports (chosen per cluster) must be reachable between nodes."""

from __future__ import annotations

import base64
import hashlib
import re
import time
from typing import Any

import anyio
import asyncssh

from clusterd import log
from clusterd.providers.aws.ec2 import EC2Api, tag_value
from clusterd.providers.base import BlockScope, ProvisionError
from clusterd.providers.ports import port_ranges

logger = log.get("clusterd.aws")

SSH_PORT = 22
GROUP_PREFIX = "clusterd-"
TAG_CLOUD_NAME = "clusterd-cluster-name"
TAG_MANAGED_BY = "clusterd-managed-by"
# After its instances are terminated, EC2 lets go of a security group within a minute or two.
GROUP_RELEASE_TIMEOUT_S = 600.0


def _ingress(ranges: list[tuple[int, int]]) -> list[dict[str, Any]]:
    return [{"IpProtocol": "tcp", "FromPort": first, "ToPort": last,
             "IpRanges": [{"CidrIp": "0.0.0.0/0"}]} for first, last in ranges]


def key_pair_fingerprints(public_openssh: str) -> tuple[str, ...]:
    """What EC2 may report as the fingerprint of a key pair imported from this public key
    (normalised, EC2's documented form first). For ED25519: the SHA-256 of the key as OpenSSH
    encodes it, in base64 (what `ssh-keygen -l` shows); for RSA: the MD5 of that (RFC 4716)
    or of the DER form. EC2-compatible endpoints (moto) hash the DER form (SHA-256 for
    ED25519, MD5 for RSA) and show it in hex; as much a digest of this one key, it is
    accepted too."""
    key = asyncssh.import_public_key(public_openssh)
    blob, der = key.public_data, key.export_public_key("pkcs8-der")
    if key.algorithm == b"ssh-ed25519":
        return (_normal(base64.b64encode(hashlib.sha256(blob).digest()).decode()),
                _normal(hashlib.sha256(der).hexdigest()))
    return _normal(hashlib.md5(blob).hexdigest()), _normal(hashlib.md5(der).hexdigest())


def same_fingerprint(reported: str, fingerprints: tuple[str, ...]) -> bool:
    return bool(reported) and _normal(reported) in fingerprints


def _normal(fingerprint: str) -> str:
    """One spelling per fingerprint: no `SHA256:`/`MD5:` prefix or base64 padding (EC2 shows
    the padding, ssh-keygen does not), hex as lower-case pairs with colons."""
    text = fingerprint.strip().removeprefix("SHA256:").removeprefix("MD5:").rstrip("=")
    plain = text.replace(":", "")  # base64 has no colons, and SHA-256's is 43 long
    if re.fullmatch(r"[0-9a-fA-F]{32}|[0-9a-fA-F]{64}", plain):
        return ":".join(plain[i:i + 2] for i in range(0, len(plain), 2)).lower()
    return text


def self_rule(group: str) -> dict[str, Any]:
    """All protocols, from the group's own members (SkyPilot's rule for its clusters)."""
    return {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}


def _lets_members_in(permissions: list[dict[str, Any]], group: str) -> bool:
    return any(p.get("IpProtocol") == "-1"
               and any(pair.get("GroupId") == group for pair in p.get("UserIdGroupPairs", []))
               for p in permissions)


def routes_to_internet(tables: list[dict[str, Any]], subnet: str) -> bool:
    """Whether `subnet`'s route table (its own association, else the VPC's main table) sends
    0.0.0.0/0 to an internet gateway (a blackholed route, one whose gateway is gone, does
    not count)."""
    own = [t for t in tables if any(a.get("SubnetId") == subnet
                                    for a in t.get("Associations", []))]
    table = own[0] if own else next(
        (t for t in tables if any(a.get("Main") for a in t.get("Associations", []))), None)
    if table is None:
        return False
    return any(r.get("DestinationCidrBlock") == "0.0.0.0/0"
               and str(r.get("GatewayId") or "").startswith("igw-")
               and r.get("State", "active") == "active"
               for r in table.get("Routes", []))


class ClusterNetwork:
    def __init__(self, api: EC2Api, managed_by: str) -> None:
        self._api = api
        self._managed_by = managed_by  # groups tagged with another daemon's id are not ours
        self._key_pairs: set[tuple[str, str]] = set()
        self._root_devices: dict[tuple[str, str], str] = {}

    async def ensure_key_pair(self, region: str, name: str, public_key: str) -> None:
        """The key pair `name` in `region`, holding `public_key`: imported if missing. One of
        that name holding another key is refused, FATAL: nodes launched with it would let in
        whoever holds that key's private half and not clusterd, and failing over to another
        region would only hide a squatter in this account (for ever, with retry-until-up)."""
        if (region, name) in self._key_pairs:
            return
        pair = await self._key_pair(region, name)
        if pair is None:
            try:
                pair = await self._api.call(region, "ImportKeyPair", KeyName=name,
                                            PublicKeyMaterial=public_key.encode())
            except ProvisionError as exc:
                if "InvalidKeyPair.Duplicate" not in exc.message:
                    raise
                pair = await self._key_pair(region, name) or {}  # imported meanwhile
        reported = str(pair.get("KeyFingerprint") or "")
        ours = key_pair_fingerprints(public_key)
        if not same_fingerprint(reported, ours):
            raise ProvisionError(
                f"aws/{region}: the key pair {name} holds a public key that is not this "
                f"daemon's key (fingerprint {reported or 'not given'}; this daemon's is "
                f"{ours[0]}): nodes launched with it would let in whoever holds its private "
                "key, and not clusterd", BlockScope.FATAL,
                "if it is a leftover of yours (clusterd's state directory was reset), delete "
                f"it and launch again: aws ec2 delete-key-pair --region {region} --key-name "
                f"{name}; if not, someone with access to this AWS account made it: find out "
                "who before launching there")
        self._key_pairs.add((region, name))

    async def _key_pair(self, region: str, name: str) -> dict[str, Any] | None:
        found = (await self._api.call(region, "DescribeKeyPairs", Filters=[
            {"Name": "key-name", "Values": [name]}])).get("KeyPairs", [])
        return dict(found[0]) if found else None

    async def vpc(self, region: str, name: str | None) -> str:
        filters = ([{"Name": "tag:Name", "Values": [name]}] if name
                   else [{"Name": "isDefault", "Values": ["true"]}])
        vpcs = (await self._api.call(region, "DescribeVpcs", Filters=filters)).get("Vpcs", [])
        if not vpcs:
            what = f"no VPC named {name!r}" if name else "no default VPC"
            raise ProvisionError(f"aws/{region}: {what}", BlockScope.REGION,
                                 "set aws.vpc_name in the config to a VPC of each region "
                                 "you launch in")
        return str(vpcs[0]["VpcId"])

    async def subnet(self, region: str, vpc: str, zone: str, public: bool) -> str:
        """The subnet of `vpc` in `zone` with the most free addresses; with `public` (nodes
        reached at public addresses), only among those routing to an internet gateway: in
        another, an instance's public address answers nothing (SkyPilot checks the same)."""
        subnets = (await self._api.call(region, "DescribeSubnets", Filters=[
            {"Name": "vpc-id", "Values": [vpc]},
            {"Name": "availability-zone", "Values": [zone]},
        ])).get("Subnets", [])
        if not subnets:
            raise ProvisionError(f"aws/{region}/{zone}: the VPC {vpc} has no subnet in this "
                                 "zone", BlockScope.ZONE)
        if public:
            tables = (await self._api.call(region, "DescribeRouteTables", Filters=[
                {"Name": "vpc-id", "Values": [vpc]}])).get("RouteTables", [])
            routed = [s for s in subnets if routes_to_internet(tables, s["SubnetId"])]
            if not routed:
                names = ", ".join(sorted(s["SubnetId"] for s in subnets))
                raise ProvisionError(
                    f"aws/{region}/{zone}: no subnet of the VPC {vpc} in this zone routes to "
                    f"an internet gateway ({names}), so its nodes' public addresses would "
                    "answer nothing", BlockScope.ZONE,
                    "give a subnet's route table a route 0.0.0.0/0 to an internet gateway, "
                    "or set aws.use_internal_ips: true in the config (clusterd then reaches "
                    "nodes at their private addresses: from inside the VPC, or through "
                    "aws.ssh_proxy_command)")
            subnets = routed
        best = max(subnets, key=lambda s: int(s.get("AvailableIpAddressCount") or 0))
        return str(best["SubnetId"])

    async def root_device(self, region: str, image: str) -> str:
        key = (region, image)
        if key not in self._root_devices:
            images = (await self._api.call(region, "DescribeImages",
                                           ImageIds=[image])).get("Images", [])
            if not images:
                raise ProvisionError(f"aws/{region}: image {image} not found",
                                     BlockScope.REGION)
            self._root_devices[key] = str(images[0].get("RootDeviceName") or "/dev/sda1")
        return self._root_devices[key]

    async def ensure_security_group(self, region: str, vpc: str, cloud_name: str,
                                    tags: list[dict[str, str]], ports: tuple[str, ...]) -> str:
        name = GROUP_PREFIX + cloud_name
        found = (await self._api.call(region, "DescribeSecurityGroups", Filters=[
            {"Name": "vpc-id", "Values": [vpc]}, {"Name": "group-name", "Values": [name]},
        ])).get("SecurityGroups", [])
        if found:
            group = self._own_group(region, vpc, found[0])
        else:
            try:
                created = await self._api.call(
                    region, "CreateSecurityGroup", GroupName=name, VpcId=vpc,
                    Description=f"clusterd cluster {cloud_name}",
                    TagSpecifications=[{"ResourceType": "security-group", "Tags": tags}])
            except ProvisionError as exc:
                if "InvalidGroup.Duplicate" not in exc.message:
                    raise
                return await self.ensure_security_group(region, vpc, cloud_name, tags, ports)
            group = str(created["GroupId"])
        await self.open_ports(region, group, [(SSH_PORT, SSH_PORT), *port_ranges(ports)],
                              members=True)
        return group

    async def open_ports(self, region: str, group: str, ranges: list[tuple[int, int]],
                         members: bool = False) -> None:
        """Let in ranges (TCP, from anywhere) and, with members, all traffic from the
        group's own members; only what the group lacks is added."""
        described = (await self._api.call(region, "DescribeSecurityGroups",
                                          GroupIds=[group])).get("SecurityGroups", [])
        permissions = [p for g in described for p in g.get("IpPermissions", [])]
        have = {(p.get("FromPort"), p.get("ToPort")) for p in permissions
                if p.get("IpProtocol") == "tcp"
                and any(r.get("CidrIp") == "0.0.0.0/0" for r in p.get("IpRanges", []))}
        missing = _ingress([r for r in dict.fromkeys(ranges) if r not in have])
        if members and not _lets_members_in(permissions, group):
            missing.append(self_rule(group))
        if not missing:
            return
        if not await self._authorize(region, group, missing) and len(missing) > 1:
            # EC2 adds none of a batch when one of it is there already (added meanwhile).
            for permission in missing:
                await self._authorize(region, group, [permission])

    async def _authorize(self, region: str, group: str,
                         permissions: list[dict[str, Any]]) -> bool:
        """Add the permissions; False if EC2 says one of them is there already."""
        try:
            await self._api.call(region, "AuthorizeSecurityGroupIngress", GroupId=group,
                                 IpPermissions=permissions)
        except ProvisionError as exc:
            if "InvalidPermission.Duplicate" not in exc.message:
                raise
            return False
        return True

    def _own_group(self, region: str, vpc: str, found: dict[str, Any]) -> str:
        """The id of a group found by the cluster's group name, if this daemon made it. One of
        another clusterd's (an account shared, a cluster named alike) is not used: its
        rules are that daemon's to change, and its `down` would delete it."""
        group, owner = str(found["GroupId"]), tag_value(found, TAG_MANAGED_BY)
        if owner == self._managed_by:
            return group
        raise ProvisionError(
            f"aws/{region}: the security group {found.get('GroupName')} ({group}) in {vpc} "
            f"belongs to another clusterd (clusterd-managed-by: {owner or 'none'}; this daemon "
            f"is {self._managed_by}), so this cluster cannot use it", BlockScope.FATAL,
            "launch again: a new launch gets a name of its own on the cloud (`clusterctl "
            "down NAME` first if the cluster exists); if that clusterd is gone and nothing "
            f"uses the group, delete it: aws ec2 delete-security-group --region {region} "
            f"--group-id {group}")

    async def remove_security_groups(self, region: str, cloud_name: str
                                     ) -> list[tuple[str, str | None]]:
        """Delete the cluster's security groups that this daemon made, once no instance holds
        them; returns those of its name that another clusterd made (id, that daemon's id),
        left alone."""
        groups = (await self._api.call(region, "DescribeSecurityGroups", Filters=[
            {"Name": f"tag:{TAG_CLOUD_NAME}", "Values": [cloud_name]},
        ])).get("SecurityGroups", [])
        named = (await self._api.call(region, "DescribeSecurityGroups", Filters=[
            {"Name": "group-name", "Values": [GROUP_PREFIX + cloud_name]},
        ])).get("SecurityGroups", [])
        owners = {g["GroupId"]: tag_value(g, TAG_MANAGED_BY) for g in [*groups, *named]}
        for group, owner in sorted(owners.items()):
            if owner == self._managed_by:
                await self._delete_group(region, group)
        return [(g, owner) for g, owner in sorted(owners.items())
                if owner != self._managed_by]

    async def _delete_group(self, region: str, group: str) -> None:
        deadline = time.monotonic() + GROUP_RELEASE_TIMEOUT_S
        delay = 0.5
        while True:
            users = await self._api.instances(region, [
                {"Name": "instance.group-id", "Values": [group]},
                {"Name": "instance-state-name",
                 "Values": ["pending", "running", "shutting-down", "stopping", "stopped"]}])
            if not users:
                try:
                    await self._api.call(region, "DeleteSecurityGroup", GroupId=group)
                    logger.info("security group removed", region=region, group=group)
                    return
                except ProvisionError as exc:
                    if "InvalidGroup.NotFound" in exc.message:
                        return
                    if "DependencyViolation" not in exc.message:
                        raise
            if time.monotonic() > deadline:
                raise ProvisionError(f"aws/{region}: security group {group} is still in use "
                                     f"after {GROUP_RELEASE_TIMEOUT_S:.0f} s",
                                     BlockScope.FATAL, "run `clusterctl down` again later")
            await anyio.sleep(delay)
            delay = min(delay * 1.5, 10.0)

