"""The EC2 test bed's security group rules (scripts/_testbed/ec2/firewall.py): what EC2's API
answers, turned into nftables rules; checked by nft itself in a throwaway namespace."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "scripts"))

from _testbed.ec2.firewall import Member, members_of, ruleset

from tests.support import needs_tool

A, B, C = "i-0aaaaaaaaaaaaaaaa", "i-0bbbbbbbbbbbbbbbb", "i-0cccccccccccccccc"
CLUSTER, WEB = "sg-cluster", "sg-web"


def tcp(low: int, high: int, *cidrs: str) -> dict[str, object]:
    return {"IpProtocol": "tcp", "FromPort": low, "ToPort": high,
            "IpRanges": [{"CidrIp": c} for c in cidrs]}


def members(group: str) -> dict[str, object]:
    return {"IpProtocol": "-1", "UserIdGroupPairs": [{"GroupId": group}]}


def chain(script: str, instance_id: str) -> list[str]:
    lines = script.splitlines()
    start = next(i for i, line in enumerate(lines)
                 if line.strip().startswith(f"chain in_{instance_id.replace('-', '_')} "))
    end = next(i for i in range(start, len(lines)) if lines[i].strip() == "}")
    return [line.strip() for line in lines[start + 1:end]]


def test_an_instance_gets_its_groups_rules_and_nothing_else() -> None:
    script = ruleset(
        [Member(A, "127.1.1.4", (CLUSTER,)), Member(B, "127.1.2.9", (CLUSTER, WEB)),
         Member(C, "127.1.1.5", ())],
        {CLUSTER: [tcp(22, 22, "0.0.0.0/0"), members(CLUSTER)],
         WEB: [tcp(8000, 8010, "10.0.0.0/8", "127.1.0.0/24"),
               {"IpProtocol": "udp", "FromPort": 53, "ToPort": 53,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}]},
               {"IpProtocol": "icmp", "FromPort": 8, "ToPort": -1,
                "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]},
        ["127.1.0.0/16"])
    assert chain(script, A) == ["tcp dport 22 accept",
                                "ip saddr { 127.1.1.4, 127.1.2.9 } accept", "drop"]
    assert chain(script, B) == [
        "tcp dport 22 accept", "ip saddr { 127.1.1.4, 127.1.2.9 } accept",
        "ip saddr 10.0.0.0/8 tcp dport 8000-8010 accept",
        "ip saddr 127.1.0.0/24 tcp dport 8000-8010 accept",
        "udp dport 53 accept", "icmp type 8 accept", "drop"]
    assert chain(script, C) == ["drop"]  # no group: nothing gets in
    # Replies and tracked connections pass; a VPC address nobody holds yet is closed.
    assert "ct state established,related accept" in script
    assert "ip daddr { 127.1.0.0/16 } drop" in script
    assert script.startswith("table inet clusterd_sg\ndelete table inet clusterd_sg\n")


def test_a_source_group_without_members_lets_nobody_in() -> None:
    script = ruleset([Member(A, "127.1.1.4", (CLUSTER,))],
                     {CLUSTER: [members(WEB), tcp(22, 22, "0.0.0.0/0")]}, ["127.1.0.0/16"])
    assert chain(script, A) == ["tcp dport 22 accept", "drop"]


def test_members_come_from_the_api_and_stopped_instances_are_none() -> None:
    answer = [{"Instances": [
        {"InstanceId": A, "PrivateIpAddress": "127.1.1.4", "State": {"Name": "running"},
         "SecurityGroups": [{"GroupId": CLUSTER}],
         "NetworkInterfaces": [{"Groups": [{"GroupId": WEB}]}]},
        {"InstanceId": B, "PrivateIpAddress": "127.1.1.5", "State": {"Name": "stopped"},
         "SecurityGroups": [{"GroupId": CLUSTER}]},
        {"InstanceId": C, "State": {"Name": "pending"}, "SecurityGroups": []},
    ]}]
    assert members_of(answer) == [Member(A, "127.1.1.4", (CLUSTER, WEB))]


def test_nft_accepts_what_it_is_given() -> None:
    if os.geteuid() != 0:
        pytest.skip("nft checks a ruleset as root, in a namespace of its own")
    needs_tool("nft", "nftables")
    needs_tool("unshare", "util-linux")
    script = ruleset(
        [Member(A, "127.1.1.4", (CLUSTER,)), Member(B, "127.4.1.4", (CLUSTER,))],
        {CLUSTER: [tcp(22, 22, "0.0.0.0/0"), members(CLUSTER),
                   {"IpProtocol": "icmp", "FromPort": -1, "ToPort": -1,
                    "IpRanges": [{"CidrIp": "127.0.0.0/8"}]},
                   {"IpProtocol": "50", "IpRanges": [{"CidrIp": "0.0.0.0/0"}]}]},
        ["127.1.0.0/16", "127.4.0.0/16"])
    for rules in (script, ruleset([], {}, [])):
        # Applied for real in an empty namespace (nft -c alone skips some kernel checks).
        done = subprocess.run(["unshare", "--net", "nft", "-f", "-"], input=rules,
                              capture_output=True, text=True, timeout=30)
        assert done.returncode == 0, done.stderr + rules
