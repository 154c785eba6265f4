"""`scripts/testbed k8s private-nodes on|off`: the nodes' addresses stop answering on their node
ports for whoever is outside the cluster, as on EKS or GKE with private nodes, where a laptop
cannot reach a node's InternalIP. In the bed, "outside" is every process of the namespace that
is not a pod (the daemon runs there): an nftables rule on locally made connections (before
kube-proxy's NAT rewrites them) answers "no route to host" for any node port; pods, whose
traffic is forwarded over the bridge, are not affected. Standard library only.
"""

from __future__ import annotations

import argparse
import os

from _testbed.common import log
from _testbed.k8s import host
from _testbed.k8s.layout import NODE_PORT_RANGE, BedPaths
from _testbed.k8s.operations import require_bed

TABLE = "clusterd_k8s_private_nodes"


def ruleset(on: bool) -> str:
    text = f"table inet {TABLE}\ndelete table inet {TABLE}\n"
    if on:
        text += (f"table inet {TABLE} {{\n\tchain output {{\n"
                 "\t\ttype filter hook output priority -200; policy accept;\n"
                 f"\t\ttcp dport {NODE_PORT_RANGE} counter "
                 "reject with icmpx type host-unreachable\n\t}\n}\n")
    return text


def cmd_private_nodes(args: argparse.Namespace) -> int:
    paths = BedPaths(os.path.abspath(args.dir))
    state = require_bed(paths)
    host.in_netns(state["netns"], "nft", "-f", "-", input_text=ruleset(args.state == "on"))
    log("node ports " + ("unreachable from outside the pods (private nodes)"
                         if args.state == "on" else "reachable again"))
    return 0
