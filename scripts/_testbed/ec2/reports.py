"""`scripts/testbed ec2 status | preempt | calls | fault ...`: requests to the bed's controller
over its control socket, and their answers for people (or --json for programs). Standard
library only."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from _testbed.common import Failure, log
from _testbed.common.control import request
from _testbed.ec2.commands import controller_pid, require_bed
from _testbed.ec2.layout import BedPaths, load_state


def _paths(args: argparse.Namespace) -> BedPaths:
    return BedPaths(os.path.abspath(args.dir))


def _table(rows: list[list[str]], header: list[str]) -> None:
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for r in [header, *rows]:
        log("  " + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip())


def cmd_status(args: argparse.Namespace) -> int:
    paths = _paths(args)
    state = load_state(paths) if os.path.isdir(paths.dir) else None
    if state is None:
        print(f"no EC2 test bed in {paths.dir}")
        return 2
    if controller_pid(paths, state) is None:
        require_bed(paths)  # raises, with the controller's log
    reply = request(paths.control_sock, "status")
    regions: dict[str, list[dict[str, Any]]] = reply["regions"]
    images: dict[str, str] = reply.get("runtime_images") or {}
    if args.json:
        log(json.dumps({"dir": paths.dir, "netns": state["netns"],
                        "controller_pid": state["controller_pid"], "regions": regions,
                        "runtime_images": images}, indent=2))
        return 0
    log(f"EC2 test bed in {paths.dir} (namespace {state['netns']}, controller pid "
        f"{state['controller_pid']})")
    if images:
        key = (state.get("runtime_image") or {}).get("key", "?")
        log(f"runtime image {key}: " + ", ".join(f"{r} {i}" for r, i in images.items()))
    for region, rows in regions.items():
        log(f"{region}: {len(rows)} instance(s)")
        if not rows:
            continue
        _table([[r["id"], r["state"], r["state_reason"] or "-", r["private_ip"] or "-",
                 r["type"], r["lifecycle"], r["zone"],
                 r["node"] + (" (cut)" if r.get("partitioned") else ""),
                 ",".join(f"{k}={v}" for k, v in sorted(r["tags"].items())) or "-"]
                for r in rows],
               ["INSTANCE", "STATE", "REASON", "IP", "TYPE", "MARKET", "ZONE", "NODE", "TAGS"])
    return 0


def cmd_preempt(args: argparse.Namespace) -> int:
    paths = _paths(args)
    require_bed(paths)
    reply = request(paths.control_sock, "preempt", instance_id=args.instance_id)
    log(f"preempted spot instance {reply['instance_id']} in {reply['region']}: "
        f"{reply['state']} (Server.SpotInstanceTermination)")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """`partition` and `heal`."""
    paths = _paths(args)
    require_bed(paths)
    reply = request(paths.control_sock, args.ec2_command, instance_id=args.instance_id)
    what = "cut" if reply["partitioned"] else "restored"
    when = "now" if reply["link_changed"] else "from its next boot (it has no node now)"
    log(f"{reply['instance_id']} in {reply['region']} ({reply['state']}): link {what} {when}")
    return 0


def cmd_firewall(args: argparse.Namespace) -> int:
    paths = _paths(args)
    require_bed(paths)
    reply = request(paths.control_sock, "firewall", enforce=args.enforce)
    if args.json:
        log(json.dumps(reply, indent=2))
    else:
        log(f"# security groups {'enforced' if reply['enforce'] else 'NOT enforced'}; "
            f"generation {reply['generation']}, {reply['rules']} rule(s)")
        log(reply["ruleset"].rstrip("\n"))
    return 0


def cmd_calls(args: argparse.Namespace) -> int:
    paths = _paths(args)
    require_bed(paths)
    calls: list[dict[str, Any]] = request(paths.control_sock, "calls", reset=args.reset)["calls"]
    if args.json:
        log(json.dumps({"calls": calls, "total": sum(c["count"] for c in calls)}, indent=2))
        return 0
    if not calls:
        log("no API calls" + (" (counts reset)" if args.reset else ""))
        return 0
    _table([[c["service"] or "-", c["action"] or "-", c["region"] or "-", str(c["count"])]
            for c in calls], ["SERVICE", "ACTION", "REGION", "CALLS"])
    if args.reset:
        log("(counts reset)")
    return 0


def cmd_fault(args: argparse.Namespace) -> int:
    paths = _paths(args)
    require_bed(paths)
    sock = paths.control_sock
    if args.fault_command == "add":
        spec = {"code": args.code, "action": args.action, "region": args.region,
                "zone": args.zone, "instance_type": args.instance_type, "market": args.market,
                "count": args.count, "delay": args.delay, "hang": args.hang,
                "share": args.share}
        rule = request(sock, "fault_add", rule={k: v for k, v in spec.items()
                                                 if v not in (None, False)})["rule"]
        log(rule["id"])
        return 0
    if args.fault_command == "list":
        rules: list[dict[str, Any]] = request(sock, "fault_list")["rules"]
        if args.json:
            log(json.dumps({"rules": rules}, indent=2))
        elif not rules:
            log("no fault rules")
        else:
            _table([[r["id"], _matches(r), _effect(r), "-" if r["count"] is None
                     else str(r["count"]), str(r["fired"])] for r in rules],
                   ["ID", "MATCHES", "EFFECT", "COUNT", "FIRED"])
        return 0
    if args.fault_command == "remove":
        request(sock, "fault_remove", id=args.id)
        log(f"removed fault rule {args.id}")
        return 0
    if args.fault_command == "clear":
        n = request(sock, "fault_clear")["removed"]
        log(f"removed {n} fault rule(s)")
        return 0
    raise Failure(f"unknown fault command {args.fault_command}")


def _matches(rule: dict[str, Any]) -> str:
    names = ("action", "region", "zone", "instance_type", "market")
    return " ".join(f"{n.replace('_', '-')}={rule[n]}" for n in names if rule.get(n)) \
        or "every call"


def _effect(rule: dict[str, Any]) -> str:
    if rule.get("hang"):
        return "hang"
    if rule.get("code") and rule.get("delay"):
        return f"{rule['code']} after {rule['delay']:g}s"
    return rule.get("code") or f"late by {rule['delay']:g}s"
