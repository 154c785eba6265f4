"""The command line of scripts/testbed: argparse for both test beds, and dispatch.

Exit codes: 0 success, 1 failure (message on stderr, and a hint where useful), 2 bad usage.
Standard library only: the EC2 bed's moto and boto3 are imported by its controller alone.
"""

from __future__ import annotations

import argparse
import os
import sys

from _testbed import hosts
from _testbed.common import Failure

DANGEROUS_DIRS = ("/", "/tmp", "/home", "/root", "/run", "/var", "/etc")
EC2_COMMANDS = "{up,build-images,down,exec,env,status,preempt,partition,heal,firewall,calls,fault}"
K8S_COMMANDS = ("{build,up,down,exec,env,status,kill-node,restart-apiserver,fault,quota,"
                "gpu-style,autoscaler,plain-image,private-nodes}")


def add_hosts_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    up = sub.add_parser("up", allow_abbrev=False, help="create or complete a test bed of N hosts")
    up.add_argument("n", metavar="N", type=int, help=f"number of hosts (1-{hosts.MAX_HOSTS})")
    up.add_argument("--dir", default=hosts.default_dir())
    up.add_argument("--pool", default="testbed")
    up.add_argument("--pools-file", default=hosts.default_pools_file())
    up.add_argument("--port", type=int, default=2222)
    up.add_argument("--prefix", default="cdnode")

    down = sub.add_parser("down", allow_abbrev=False, help="destroy the test bed")
    down.add_argument("--dir", default=hosts.default_dir())
    down.add_argument("--pools-file", default=None,
                      help="default: the file `up` wrote to (else "
                           "$XDG_CONFIG_HOME/clusterd/ssh_node_pools.yaml)")

    st = sub.add_parser("status", allow_abbrev=False, help="show the hosts and whether they run")
    st.add_argument("--dir", default=hosts.default_dir())


def add_ec2_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from _testbed.ec2.layout import DEFAULT_REGIONS, default_dir

    ec2 = sub.add_parser(
        "ec2", allow_abbrev=False,
        help="an EC2 API with real machines behind it, on loopback, in a network namespace")
    esub = ec2.add_subparsers(dest="ec2_command", required=True, metavar=EC2_COMMANDS)
    bed = argparse.ArgumentParser(add_help=False)
    bed.add_argument("--dir", default=default_dir(),
                     help="default: $CLUSTERD_TESTBED_EC2_DIR or /tmp/clusterd-ec2")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true")

    up = esub.add_parser("up", parents=[bed], allow_abbrev=False,
                         help="make the bed, or add regions to it (idempotent)")
    up.add_argument("--regions", default=",".join(DEFAULT_REGIONS))
    up.add_argument("--netns", default=None,
                    help="default: $CLUSTERD_TESTBED_EC2_NETNS or clusterd-ec2")
    up.add_argument("--iam", action="store_true",
                    help="enforce IAM as AWS does: every request is checked against its "
                         "caller's policies; `exec` gets the keys of a user holding exactly "
                         "README's policy (docs/aws-iam-policy.json; DIR/aws/admin-credentials "
                         "are allowed everything), and account 222222222222 owns bucket "
                         "testbed-other-account")
    up.add_argument("--no-wheelhouse", action="store_true",
                    help="do not build the runtime wheelhouse (which needs the package index)")
    up.add_argument("--runtime-image", action="store_true",
                    help="also make a runtime image: an AMI clusterd-testbed-runtime-KEY in "
                         "every region (private, x86_64) whose instances boot with clusterd's "
                         "runtime of the wheelhouse KEY already installed in ~/.clusterd, so "
                         "clusterd skips installing it, as with an AMI of one's own. Its "
                         "template is built once per KEY, in DIR/images (about as long as one "
                         "node's install); `exec` gets the ids in "
                         "$CLUSTERD_TESTBED_RUNTIME_IMAGES, {region: AMI id} in JSON. With "
                         "--no-wheelhouse, the wheelhouse directory must hold exactly one "
                         "wheelhouse")
    up.add_argument("--image-roots", action="store_true",
                    help="boot the public images in real roots: Ubuntu 22.04's name in a "
                         "Debian bullseye root (python3 3.9, no venv module), 24.04's in "
                         "trixie (3.13); built once per machine by debootstrap into "
                         "/var/cache/clusterd-testbed/ec2-images (`ec2 build-images`). "
                         "Without it every image boots in the machine's own root")
    esub.add_parser("build-images", allow_abbrev=False,
                    help="build the image roots `up --image-roots` boots in, or find them in "
                         "the cache (once per machine: minutes); prints where they are")
    esub.add_parser("down", parents=[bed], allow_abbrev=False,
                    help="stop everything the bed started and remove it")
    ex = esub.add_parser("exec", parents=[bed], allow_abbrev=False,
                         help="run a command in the bed's namespace with its AWS environment")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    esub.add_parser("env", parents=[bed, as_json], allow_abbrev=False,
                    help="print the environment `exec` sets: the unset/export lines that make "
                         "it of this one (for eval), or with --json all of it")
    esub.add_parser("status", parents=[bed, as_json], allow_abbrev=False,
                    help="instances by region, and their nodes")
    pre = esub.add_parser("preempt", parents=[bed], allow_abbrev=False,
                          help="interrupt a spot instance (terminated by EC2)")
    pre.add_argument("instance_id", metavar="INSTANCE_ID")
    part = esub.add_parser("partition", parents=[bed], allow_abbrev=False,
                           help="cut an instance's network link (its processes live on; it "
                                "stays cut across stop/start until `heal`)")
    part.add_argument("instance_id", metavar="INSTANCE_ID")
    heal = esub.add_parser("heal", parents=[bed], allow_abbrev=False,
                           help="restore an instance's network link")
    heal.add_argument("instance_id", metavar="INSTANCE_ID")
    fw = esub.add_parser("firewall", parents=[bed, as_json], allow_abbrev=False,
                         help="the nftables rules that enforce the security groups now")
    onoff = fw.add_mutually_exclusive_group()
    onoff.add_argument("--off", dest="enforce", action="store_false", default=None,
                       help="stop enforcing security groups (every node reaches every port; "
                            "to measure what enforcement costs)")
    onoff.add_argument("--on", dest="enforce", action="store_true",
                       help="enforce them again (the default)")
    calls = esub.add_parser("calls", parents=[bed, as_json], allow_abbrev=False,
                            help="API calls by service, action and region")
    calls.add_argument("--reset", action="store_true", help="and start counting from zero")

    fault = esub.add_parser("fault", allow_abbrev=False, help="fault rules of the API endpoint")
    fsub = fault.add_subparsers(dest="fault_command", required=True,
                                metavar="{add,list,remove,clear}")
    add = fsub.add_parser("add", parents=[bed], allow_abbrev=False,
                          help="add a rule (prints its id); it applies from the next call")
    add.add_argument("--code", help="the error code to answer with, e.g. "
                                    "InsufficientInstanceCapacity")
    add.add_argument("--action", help="e.g. RunInstances")
    add.add_argument("--region")
    add.add_argument("--zone", help="RunInstances' availability zone")
    add.add_argument("--instance-type")
    add.add_argument("--market", choices=("spot", "on-demand"), help="RunInstances' market")
    add.add_argument("--count", type=int, help="fire only for the first N matching calls")
    add.add_argument("--share", type=float, metavar="F",
                     help="fire on this fraction (0-1] of the matching calls, at random")
    how = add.add_mutually_exclusive_group()
    how.add_argument("--delay", type=float, metavar="S",
                     help="answer S seconds late (the error, or moto's answer without --code)")
    how.add_argument("--hang", action="store_true",
                     help="forward the call, never answer it")
    fsub.add_parser("list", parents=[bed, as_json], allow_abbrev=False,
                    help="the rules, with how often each fired")
    rm = fsub.add_parser("remove", parents=[bed], allow_abbrev=False, help="remove a rule")
    rm.add_argument("id", metavar="ID")
    fsub.add_parser("clear", parents=[bed], allow_abbrev=False, help="remove every rule")


def add_k8s_commands(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    from _testbed.k8s.layout import DIR_ENV, NETNS_ENV, default_dir

    k8s = sub.add_parser(
        "k8s", allow_abbrev=False,
        help="a real Kubernetes (built from Debian's source) with real kubelets, in a network "
             "namespace")
    ksub = k8s.add_subparsers(dest="k8s_command", required=True, metavar=K8S_COMMANDS)
    bed = argparse.ArgumentParser(add_help=False)
    bed.add_argument("--dir", default=default_dir(),
                     help=f"default: ${DIR_ENV} or /tmp/clusterd-k8s")
    as_json = argparse.ArgumentParser(add_help=False)
    as_json.add_argument("--json", action="store_true")

    up = ksub.add_parser("up", parents=[bed], allow_abbrev=False,
                         help="make the bed, or bring it to what is asked (idempotent; the "
                              "first `up` on a machine builds Kubernetes: minutes)")
    up.add_argument("--nodes", type=int, help="ordinary nodes cpu-1..N (a new bed: 2)")
    up.add_argument("--gpu-nodes", type=int,
                    help="nodes gpu-1..M with 2 fake A100s each (a new bed: 1)")
    up.add_argument("--netns", default=None, help=f"default: ${NETNS_ENV} or clusterd-k8s")
    up.add_argument("--runtime-image", action="store_true",
                    help="also an image with clusterd's runtime of its wheelhouse already in "
                         "~sky/.clusterd (clusterd then skips installing it), imported into "
                         "every node; built once per wheelhouse (the package index is needed "
                         "once); its name is $CLUSTERD_TESTBED_K8S_RUNTIME_IMAGE in `exec`")
    up.add_argument("--no-wheelhouse", action="store_true",
                    help="do not prepare the runtime's wheelhouse (which needs the package "
                         "index once per version of clusterd; a daemon in the bed cannot "
                         "install the runtime without it)")
    build = ksub.add_parser("build", allow_abbrev=False,
                            help="build (or find in the cache) what `up` boots from, and "
                                 "start nothing (the first time on a machine: minutes)")
    build.add_argument("--runtime-image", action="store_true",
                       help="the runtime image too (as `up --runtime-image` would)")
    ksub.add_parser("down", parents=[bed], allow_abbrev=False,
                    help="stop everything the bed started and remove it")
    ex = ksub.add_parser("exec", parents=[bed], allow_abbrev=False,
                         help="run a command in the bed's namespace with KUBECONFIG set")
    ex.add_argument("cmd", nargs=argparse.REMAINDER, metavar="-- CMD ...")
    ksub.add_parser("env", parents=[bed, as_json], allow_abbrev=False,
                    help="print the environment `exec` sets (for eval, or --json)")
    ksub.add_parser("status", parents=[bed, as_json], allow_abbrev=False,
                    help="processes, nodes, pods, contexts")
    kill = ksub.add_parser("kill-node", parents=[bed], allow_abbrev=False,
                           help="lose a node: its kubelet, containerd and pods die")
    kill.add_argument("name", metavar="NAME")
    kill.add_argument("--forget", action="store_true",
                      help="also delete its Node object (as a cloud does when the machine is "
                           "gone): its pods are then deleted too")
    ksub.add_parser("restart-apiserver", parents=[bed], allow_abbrev=False,
                    help="stop and start the API server (cuts watches, exec, port-forwards)")
    fault = ksub.add_parser("fault", allow_abbrev=False,
                            help="fault rules of the API endpoint clusterd's contexts use")
    fsub = fault.add_subparsers(dest="fault_command", required=True,
                                metavar="{add,list,remove,clear}")
    add = fsub.add_parser("add", parents=[bed], allow_abbrev=False,
                          help="add a rule (prints its id); it applies from the next request")
    add.add_argument("--code", type=int, help="answer with this HTTP code and the Status the "
                                              "API server would send (403, 409, 429, 500 ...)")
    add.add_argument("--verb", help="create, get, list, watch, update, patch, delete, "
                                    "deletecollection")
    add.add_argument("--resource", help="e.g. pods, services, pods/exec")
    add.add_argument("--namespace", help="e.g. bed-a (one context's namespace)")
    add.add_argument("--name", help="the object's name (not for create)")
    add.add_argument("--count", type=int, help="fire only for the first N matching requests")
    add.add_argument("--delay", type=float, metavar="S",
                     help="answer S seconds late (the code, or the API server's answer)")
    add.add_argument("--message", help="the Status message (default: one like the API "
                                       "server's for the code)")
    fsub.add_parser("list", parents=[bed, as_json], allow_abbrev=False,
                    help="the rules, with how often each fired")
    rm = fsub.add_parser("remove", parents=[bed], allow_abbrev=False, help="remove a rule")
    rm.add_argument("id", metavar="ID")
    fsub.add_parser("clear", parents=[bed], allow_abbrev=False, help="remove every rule")
    quota = ksub.add_parser("quota", parents=[bed, as_json], allow_abbrev=False,
                            help="show or set context bed-b's ResourceQuota (0 runs it out)")
    quota.add_argument("--pods", type=int)
    quota.add_argument("--gpus", type=int, help="requests.nvidia.com/gpu")
    quota.add_argument("--limits-cpu", metavar="CPUS",
                       help="limits.cpu: then every pod must state its CPU limit ('none' "
                            "drops it)")
    style = ksub.add_parser("gpu-style", parents=[bed], allow_abbrev=False,
                            help="label and taint the GPU nodes as GKE, GPU feature "
                                 "discovery, Karpenter or SkyPilot do (bed: as `up` made them)")
    style.add_argument("style", choices=("bed", "gke", "gfd", "karpenter", "skypilot"))
    scaler = ksub.add_parser("autoscaler", parents=[bed], allow_abbrev=False,
                             help="run a cluster autoscaler whose pool is NODE...: held back "
                                  "(cordoned), each added when a pod waits unschedulable")
    scaler.add_argument("nodes", nargs="+", metavar="NODE")
    ksub.add_parser("plain-image", parents=[bed, as_json], allow_abbrev=False,
                    help="a plain python3 image (no sshd, rsync, sudo) in every node, and "
                         "Debian's archive within the pods' reach (prints the host alias)")
    private = ksub.add_parser("private-nodes", parents=[bed], allow_abbrev=False,
                              help="node ports unreachable from outside the pods (as private "
                                   "EKS/GKE nodes from a laptop), or reachable again")
    private.add_argument("state", choices=("on", "off"))
    scaler.add_argument("--boot-delay", type=float, default=15.0, metavar="S",
                        help="seconds a new node takes to join (default 15)")


def check_k8s_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    from _testbed.common.host import NETNS_RE
    from _testbed.k8s.commands import check_counts

    cmd = args.k8s_command
    if cmd == "up":
        bad = check_counts(args.nodes, args.gpu_nodes)
        if bad:
            ap.error(bad)
        if args.netns is not None and not NETNS_RE.match(args.netns):
            ap.error("--netns must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 40 characters)")
        if args.no_wheelhouse and args.runtime_image:
            ap.error("--runtime-image is made of the wheelhouse: drop --no-wheelhouse")
    if cmd == "exec" and not [c for c in args.cmd if c != "--"]:
        ap.error("k8s exec needs a command: testbed k8s exec -- CMD ...")
    if cmd == "fault" and args.fault_command == "add":
        if args.code is None and args.delay is None:
            ap.error("fault add needs --code (or --delay)")
        if args.code is not None and not 400 <= args.code <= 599:
            ap.error("--code must be an HTTP error code (400-599)")
        if args.count is not None and args.count < 1:
            ap.error("--count must be at least 1")
    if cmd == "quota" and any(v is not None and v < 0 for v in (args.pods, args.gpus)):
        ap.error("quota limits cannot be negative")


def run_k8s(args: argparse.Namespace) -> int:
    from _testbed.k8s import (
        autoscaler,
        commands,
        gpu_style,
        operations,
        plain_image,
        private_nodes,
        reports,
    )

    handlers = {"build": commands.cmd_build, "up": commands.cmd_up, "down": commands.cmd_down,
                "kill-node": operations.cmd_kill_node,
                "restart-apiserver": operations.cmd_restart_apiserver,
                "exec": reports.cmd_exec, "env": reports.cmd_env, "status": reports.cmd_status,
                "fault": reports.cmd_fault, "quota": reports.cmd_quota,
                "gpu-style": gpu_style.cmd_gpu_style, "autoscaler": autoscaler.cmd_autoscaler,
                "plain-image": plain_image.cmd_plain_image,
                "private-nodes": private_nodes.cmd_private_nodes}
    return handlers[args.k8s_command](args)


def parse(argv: list[str]) -> tuple[argparse.Namespace, list[str]]:
    """The arguments, and the EC2 bed's regions (checked) for `ec2 up`."""
    ap = argparse.ArgumentParser(
        prog="testbed", allow_abbrev=False,
        description="Local test beds for clusterd: N sshd 'hosts' on 127.0.0.2.. for SSH pools "
                    "(up/down/status), an EC2 API with machines behind it (ec2 ...), or a "
                    "real Kubernetes with real kubelets (k8s ...).")
    sub = ap.add_subparsers(dest="command", required=True,
                            metavar="{up,down,status,ec2,k8s}")
    add_hosts_commands(sub)
    add_ec2_commands(sub)
    add_k8s_commands(sub)

    args = ap.parse_args(argv)
    regions: list[str] = []
    if args.command == "up":
        sp = sub.choices["up"]
        if not 1 <= args.n <= hosts.MAX_HOSTS:
            sp.error(f"N must be between 1 and {hosts.MAX_HOSTS}")
        if not 1 <= args.port <= 65535:
            sp.error("--port must be between 1 and 65535")
        if not hosts.USER_RE.match(args.prefix) or \
                len(args.prefix) + len(str(hosts.MAX_HOSTS)) > 32:
            sp.error("--prefix must be a valid user name start ([a-z_][a-z0-9_-]*, short)")
        if not hosts.POOL_RE.match(args.pool):
            sp.error("--pool must match [A-Za-z0-9_][A-Za-z0-9_.-]*")
    if args.command == "ec2":
        regions = check_ec2_args(ap, args)
    if args.command == "k8s":
        check_k8s_args(ap, args)
    if hasattr(args, "dir"):  # `k8s build` makes no bed
        if not args.dir:
            ap.error("--dir must not be empty")
        if os.path.abspath(args.dir) in DANGEROUS_DIRS:
            ap.error(f"--dir {args.dir} is not a test bed directory (it gets deleted by down)")
    return args, regions


def check_ec2_args(ap: argparse.ArgumentParser, args: argparse.Namespace) -> list[str]:
    from _testbed.common.host import NETNS_RE
    from _testbed.ec2.regions import check_regions

    regions: list[str] = []
    if args.ec2_command == "up":
        try:
            regions = check_regions([r.strip() for r in args.regions.split(",") if r.strip()])
        except ValueError as e:
            ap.error(f"--regions: {e}")
        if args.netns is not None and not NETNS_RE.match(args.netns):
            ap.error("--netns must match [A-Za-z0-9][A-Za-z0-9_.-]* (at most 40 characters)")
    if args.ec2_command == "exec" and not [c for c in args.cmd if c != "--"]:
        ap.error("ec2 exec needs a command: testbed ec2 exec -- CMD ...")
    if args.ec2_command == "fault" and args.fault_command == "add":
        if args.code is None and args.delay is None and not args.hang:
            ap.error("fault add needs --code (or --delay, or --hang)")
        if args.count is not None and args.count < 1:
            ap.error("--count must be at least 1")
        if args.delay is not None and not 0 <= args.delay <= 900:
            ap.error("--delay must be between 0 and 900 seconds")
        if args.share is not None and not 0 < args.share <= 1:
            ap.error("--share must be above 0 and at most 1")
    return regions


def run_ec2(args: argparse.Namespace, regions: list[str]) -> int:
    from _testbed.ec2 import commands, reports

    cmd = args.ec2_command
    if cmd == "up":
        return commands.cmd_up(args, regions)
    if cmd == "down":
        return commands.cmd_down(args)
    if cmd == "build-images":
        return commands.cmd_build_images(args)
    if cmd == "exec":
        return commands.cmd_exec(args)
    if cmd == "env":
        return commands.cmd_env(args)
    if cmd == "status":
        return reports.cmd_status(args)
    if cmd == "preempt":
        return reports.cmd_preempt(args)
    if cmd in ("partition", "heal"):
        return reports.cmd_partition(args)
    if cmd == "firewall":
        return reports.cmd_firewall(args)
    if cmd == "calls":
        return reports.cmd_calls(args)
    return reports.cmd_fault(args)


def main(argv: list[str]) -> int:
    args, regions = parse(argv)
    if os.geteuid() != 0:
        why = {"ec2": "it makes a network namespace, a user and machines",
               "k8s": "it makes a network namespace, cgroups and nodes"}.get(
            args.command, "it creates users and runs sshd")
        print(f"testbed: must be run as root ({why}); try: sudo "
              + " ".join([sys.argv[0], *argv]), file=sys.stderr)
        return 1
    try:
        if args.command == "ec2":
            return run_ec2(args, regions)
        if args.command == "k8s":
            return run_k8s(args)
        if args.command == "up":
            return hosts.cmd_up(args)
        if args.command == "down":
            return hosts.cmd_down(args)
        return hosts.cmd_status(args)
    except Failure as e:
        print(f"testbed: error: {e}", file=sys.stderr)
        if e.hint:
            print(f"hint: {e.hint}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("testbed: interrupted", file=sys.stderr)
        return 1
