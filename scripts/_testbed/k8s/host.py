"""What the Kubernetes bed changes on the machine outside its directory, and how each is undone:

- its network namespace (lo, one bridge; per-namespace settings and an nftables guard in it);
- the registry of live beds in /run/clusterd-testbed/k8s (common/host.py's K8S_BEDS: several
  may be up, with other --dir/--netns; what they share goes when the last one does);
- the global kernel settings the kubelet rewrites (saved before the first kubelet of any bed
  starts, restored when the last bed goes down);
- cgroup directories, one root per node, /sys/fs/cgroup/<hierarchy>/clusterd-testbed-k8s.NETNS.

Standard library only.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess

from _testbed.common import Failure, read_text, run, write_file
from _testbed.common.host import K8S_BEDS, K8S_SAVED_SETTINGS, create_netns
from _testbed.k8s.layout import BED_IP, BRIDGE, CGROUP_PREFIX, SUBNET

# The kubelet's container manager sets these (pkg/kubelet/cm: setupKernelTunables).
KERNEL_SETTINGS = ("vm/overcommit_memory", "vm/panic_on_oom", "kernel/panic",
                   "kernel/panic_on_oops", "kernel/keys/root_maxkeys",
                   "kernel/keys/root_maxbytes")
SAVED_SETTINGS = os.path.join(K8S_BEDS.directory, K8S_SAVED_SETTINGS)
GUARD_TABLE = "clusterd_k8s_guard"


# ---------------------------------------------------------------------------- kernel settings


def read_setting(name: str) -> str:
    with open(os.path.join("/proc/sys", name)) as f:
        return f.read().strip()


def save_kernel_settings() -> dict[str, str]:
    """The values before any kubelet ran (saved once, by the first bed to start kubelets)."""
    text = read_text(SAVED_SETTINGS)
    if text:
        saved: dict[str, str] = json.loads(text)
        return saved
    saved = {name: read_setting(name) for name in KERNEL_SETTINGS}
    write_file(os.path.join(K8S_BEDS.ensure_dir(), K8S_SAVED_SETTINGS),
               json.dumps(saved, indent=2) + "\n", 0o644)
    return saved


def restore_kernel_settings() -> list[str]:
    """Put the saved values back and forget them (the last bed going down). Returns errors."""
    text = read_text(SAVED_SETTINGS)
    if not text:
        return []
    errors = []
    for name, value in json.loads(text).items():
        try:
            if read_setting(name) != value:
                with open(os.path.join("/proc/sys", name), "w") as f:
                    f.write(value)
        except OSError as e:
            errors.append(f"restoring {name}={value}: {e}")
    if not errors:
        os.unlink(SAVED_SETTINGS)
    return errors


# ---------------------------------------------------------------------------- cgroups


def cgroup_mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of the machine's cgroup hierarchies."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            pre, _, post = line.partition(" - ")
            fields, rest = pre.split(), post.split()
            if rest and rest[0] in ("cgroup", "cgroup2"):
                out.append((fields[4], rest[0], rest[2] if len(rest) > 2 else ""))
    return out


def check_cgroups() -> None:
    """The kubelet of v1.20 needs the cgroup v1 controllers: say so plainly if they are not."""
    v1 = {opt for mp, fs, opts in cgroup_mounts() if fs == "cgroup" for opt in opts.split(",")}
    missing = [c for c in ("cpu", "cpuacct", "cpuset", "memory", "pids") if c not in v1]
    if missing:
        kind = "cgroup v2 only" if not v1 else "cgroup v1 without " + ", ".join(missing)
        raise Failure(f"the real kubelet (v1.20) cannot run on this machine: it has {kind} "
                      f"({run(['stat', '-fc', '%T', '/sys/fs/cgroup']).stdout.strip()} on "
                      f"/sys/fs/cgroup); the bed has nothing else to offer",
                      hint="a machine with the cgroup v1 hierarchies (hybrid) mounted")


def bed_cgroup(netns: str) -> str:
    return f"{CGROUP_PREFIX}.{netns}"


def node_cgroup_root(netns: str, node: str) -> str:
    """The kubelet's cgroupRoot for a node (its pods go under ROOT/kubepods)."""
    return f"/{bed_cgroup(netns)}/{node}"


def ensure_cgroup_root(netns: str, node: str) -> None:
    """The node's cgroup root in every v1 hierarchy (cpuset needs cpus and mems filled in)."""
    for mountpoint, fstype, _ in cgroup_mounts():
        if fstype != "cgroup":
            continue
        parent = mountpoint
        for part in (bed_cgroup(netns), node):
            path = os.path.join(parent, part)
            if not os.path.isdir(path):
                os.mkdir(path)
                for knob in ("cpuset.cpus", "cpuset.mems"):
                    src = os.path.join(parent, knob)
                    if os.path.exists(src):
                        write_knob(os.path.join(path, knob), read_text(src) or "")
            parent = path


def write_knob(path: str, value: str) -> None:
    with open(path, "w") as f:
        f.write(value.strip() or "\n")


def remove_cgroups(netns: str, node: str | None = None) -> list[str]:
    """rmdir the bed's (or one node's) cgroups, deepest first. Returns those that stay."""
    left = []
    for mountpoint, _, _ in cgroup_mounts():
        top = os.path.join(mountpoint, bed_cgroup(netns), *([node] if node else []))
        if not os.path.isdir(top):
            continue
        for root, dirs, _ in os.walk(top, topdown=False):
            for d in dirs:
                with contextlib.suppress(OSError):
                    os.rmdir(os.path.join(root, d))
        try:
            os.rmdir(top)
        except OSError as e:
            left.append(f"{top}: {e.strerror}")
    return left


# ---------------------------------------------------------------------------- the namespace


def in_netns(netns: str, *cmd: str, input_text: str | None = None) -> str:
    """Run cmd in the namespace (its stdout); Failure if it fails."""
    p = subprocess.run(["ip", "netns", "exec", netns, *cmd], input=input_text,
                       capture_output=True, text=True, timeout=60,
                       stdin=None if input_text is not None else subprocess.DEVNULL)
    if p.returncode != 0:
        raise Failure(f"{' '.join(cmd)} in namespace {netns} failed (exit {p.returncode}): "
                      f"{(p.stderr or p.stdout).strip()}")
    return p.stdout


def guard_ruleset() -> str:
    """Nothing is forwarded but from the bridge to the bridge (pods to services): the
    namespace has no other link today, and this keeps it so for forwarding."""
    return (f"table inet {GUARD_TABLE}\ndelete table inet {GUARD_TABLE}\n"
            f"table inet {GUARD_TABLE} {{\n"
            "\tchain forward {\n\t\ttype filter hook forward priority -200; policy accept;\n"
            f"\t\tiifname != \"{BRIDGE}\" counter drop\n"
            f"\t\toifname != \"{BRIDGE}\" counter drop\n\t}}\n}}\n")


def setup_network(netns: str, node_ips: list[str]) -> None:
    """The namespace (only lo in it, or refuse), its bridge with the bed's and the nodes'
    addresses, forwarding on the bridge alone, bridged traffic through netfilter (kube-proxy
    needs it for a pod reaching a service whose endpoint is on the same bridge), and the
    guard. Idempotent."""
    if not os.path.exists(f"/run/netns/{netns}"):
        create_netns(netns)
    links = run(["ip", "-n", netns, "-o", "link", "show"]).stdout
    if f" {BRIDGE}:" not in links:
        run(["ip", "-n", netns, "link", "add", BRIDGE, "type", "bridge"])
    have = run(["ip", "-n", netns, "-4", "-o", "addr", "show", "dev", BRIDGE]).stdout
    for ip in [BED_IP, *node_ips]:
        if f" {ip}/" not in have:
            run(["ip", "-n", netns, "addr", "add", f"{ip}/{SUBNET.prefixlen}", "dev", BRIDGE])
    run(["ip", "-n", netns, "link", "set", BRIDGE, "up"])
    for name, value in ((f"net/ipv4/conf/{BRIDGE}/forwarding", "1"),
                        ("net/bridge/bridge-nf-call-iptables", "1")):
        in_netns(netns, "sh", "-c", f"echo {value} > /proc/sys/{name}")
    in_netns(netns, "nft", "-f", "-", input_text=guard_ruleset())


def remove_node_ip(netns: str, ip: str) -> None:
    run(["ip", "-n", netns, "addr", "del", f"{ip}/{SUBNET.prefixlen}", "dev", BRIDGE],
        check=False)
