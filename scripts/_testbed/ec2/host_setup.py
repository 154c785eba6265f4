"""What the EC2 test bed changes on the machine itself, outside its directory: the network
namespace, the `ubuntu` user every node logs in as and its sudoers file, the mount points nodes
use, and the registry of live beds (several may be up at once, with other --dir/--netns; the
shared pieces go only when the last one does). Standard library only."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import tempfile

from _testbed.common import (
    Failure,
    delete_user,
    getpw,
    read_text,
    run,
    unlocked_password_field,
    write_file,
)
from _testbed.ec2.layout import NODE_DISK, NODE_HOME, NODE_MOUNT, NODE_USER, BedPaths

REGISTRY = "/run/clusterd-testbed/ec2"  # one NETNS.json per live bed: {"dir", "netns"}
SUDOERS_FILE = "/etc/sudoers.d/clusterd-testbed-ubuntu"
SUDOERS = f"# the clusterd EC2 test bed's nodes (scripts/testbed ec2)\n" \
          f"{NODE_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
GECOS = "clusterd testbed ec2"  # marks the ubuntu user as the test bed's
NETNS_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
STUBS = ("shutdown", "poweroff", "halt", "reboot")

STUB = """#!/bin/sh
# The clusterd EC2 test bed's {name}: asks the bed to do what powering off does to an EC2
# instance (its InstanceInitiatedShutdownBehavior: stop or terminate), or to reboot it.
req={request}
if [ "$(id -u)" != 0 ]; then echo "{name}: must be run as root" >&2; exit 1; fi
what=poweroff
[ "{name}" = reboot ] && what=reboot
for a in "$@"; do
  case "$a" in
    -c|--cancel) rm -f "$req"; exit 0 ;;
    -k) exit 0 ;;
    -r|--reboot) what=reboot ;;
  esac
done
echo "$what" > "$req.tmp" && mv -f "$req.tmp" "$req"
"""


# ---------------------------------------------------------------------------- registry


def registry_dir() -> str:
    os.makedirs(REGISTRY, mode=0o755, exist_ok=True)
    return REGISTRY


def register(paths: BedPaths, netns: str) -> None:
    write_file(os.path.join(registry_dir(), f"{netns}.json"),
               json.dumps({"dir": paths.dir, "netns": netns}) + "\n", 0o644)


def unregister(netns: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(os.path.join(REGISTRY, f"{netns}.json"))


def live_beds() -> dict[str, str]:
    """{netns: dir} of the beds whose directory still has a state file naming that namespace
    (entries of beds that went away without `down` are dropped)."""
    out: dict[str, str] = {}
    try:
        names = os.listdir(REGISTRY)
    except FileNotFoundError:
        return out
    for name in names:
        if not name.endswith(".json"):
            continue
        path = os.path.join(REGISTRY, name)
        try:
            entry = json.loads(read_text(path) or "")
            state = json.loads(read_text(os.path.join(entry["dir"], "state.json")) or "")
            if state.get("netns") == entry["netns"] == name[:-5]:
                out[entry["netns"]] = entry["dir"]
                continue
        except (ValueError, KeyError, TypeError, OSError):
            pass
        if not netns_exists(name[:-5]):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)
    return out


def registered_netns(d: str) -> str | None:
    """The namespace the registry has for the bed in d (even one whose state file is gone)."""
    try:
        names = sorted(os.listdir(REGISTRY))
    except FileNotFoundError:
        return None
    for name in names:
        with contextlib.suppress(ValueError, KeyError, TypeError):
            entry = json.loads(read_text(os.path.join(REGISTRY, name)) or "")
            if entry["dir"] == d:
                return str(entry["netns"])
    return None


# ---------------------------------------------------------------------------- namespace


def netns_exists(name: str) -> bool:
    return os.path.exists(os.path.join("/run/netns", name))


def create_netns(name: str) -> None:
    """A network namespace with only `lo`, up (so 127.0.0.0/8 works in it)."""
    if not netns_exists(name):
        run(["ip", "netns", "add", name])
    run(["ip", "-n", name, "link", "set", "lo", "up"])
    links = run(["ip", "-n", name, "-o", "link", "show"]).stdout
    names = [ln.split(":")[1].strip().split("@")[0] for ln in links.splitlines() if ":" in ln]
    if names != ["lo"]:
        raise Failure(f"network namespace {name} has interfaces {names}, not only lo; "
                      f"refusing to use it", hint=f"ip netns del {name}, or use another --netns")


def netns_pids(name: str) -> list[int]:
    if not netns_exists(name):
        return []
    p = run(["ip", "netns", "pids", name], check=False)
    return [int(x) for x in p.stdout.split() if x.isdigit()]


def delete_netns(name: str) -> None:
    if netns_exists(name):
        run(["ip", "netns", "del", name])


# ---------------------------------------------------------------------------- node user, mounts


def ensure_node_user() -> None:
    """The `ubuntu` user (ours, or refuse), its sudo rights and the nodes' mount points."""
    pw = getpw(NODE_USER)
    if pw is not None and pw.pw_gecos != GECOS:
        raise Failure(f"a user '{NODE_USER}' exists that the test bed did not create "
                      f"(comment {pw.pw_gecos!r}); the EC2 test bed's nodes need one of their own",
                      hint=f"run the bed on a machine without a '{NODE_USER}' user")
    if pw is None:
        run(["useradd", "-M", "-d", NODE_HOME, "-s", "/bin/bash", "-c", GECOS, NODE_USER])
        pw = getpw(NODE_USER)
        if pw is None:
            raise Failure(f"useradd {NODE_USER} made no user")
    unlocked_password_field(NODE_USER)
    for d in (NODE_HOME, NODE_MOUNT, NODE_DISK):  # mount points: a node mounts its own there
        os.makedirs(d, mode=0o755, exist_ok=True)
    os.chown(NODE_HOME, pw.pw_uid, pw.pw_gid)
    os.makedirs("/usr/local/sbin", mode=0o755, exist_ok=True)
    if read_text(SUDOERS_FILE) != SUDOERS:
        os.makedirs(os.path.dirname(SUDOERS_FILE), mode=0o750, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".clusterd-testbed-", dir="/etc")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(SUDOERS)
            os.chmod(tmp, 0o440)
            check = run(["visudo", "-cf", tmp], check=False)
            if check.returncode != 0:
                raise Failure(f"visudo rejects the sudoers file: {check.stdout}{check.stderr}")
            os.replace(tmp, SUDOERS_FILE)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)


def remove_node_user() -> list[str]:
    """Undo ensure_node_user (only the last bed going down calls this). Returns errors."""
    errors: list[str] = []
    with contextlib.suppress(FileNotFoundError):
        os.unlink(SUDOERS_FILE)
    pw = getpw(NODE_USER)
    if pw is not None and pw.pw_gecos == GECOS:
        errors += delete_user(NODE_USER)
    for d in (NODE_MOUNT, NODE_HOME, NODE_DISK):
        with contextlib.suppress(OSError):  # only if empty: it is a mount point, nothing more
            os.rmdir(d)
    return errors


def write_stubs(paths: BedPaths) -> None:
    """The shutdown stubs nodes see on /usr/local/sbin (sudo's secure_path looks there first)."""
    os.makedirs(paths.node_sbin, mode=0o755, exist_ok=True)
    request = os.path.join(NODE_MOUNT, "shutdown-request")
    for name in STUBS:
        write_file(os.path.join(paths.node_sbin, name),
                   STUB.format(name=name, request=request), 0o755)


def mounts_under(path: str) -> list[str]:
    """Mount points at or below path in this mount namespace (rmtree must not walk into one)."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mp = line.split()[4].encode().decode("unicode_escape")
            if mp == path or mp.startswith(path.rstrip("/") + "/"):
                out.append(mp)
    return out


def remove_dir(paths: BedPaths, keep: tuple[str, ...] = ()) -> None:
    """Delete the bed's directory, or everything in it but the entries named in keep."""
    mounted = mounts_under(paths.dir)
    if mounted:
        raise Failure(f"{paths.dir} has mounts under it ({', '.join(mounted)}); not deleting it")
    if not keep:
        shutil.rmtree(paths.dir)
        return
    for name in os.listdir(paths.dir):
        if name not in keep:
            p = os.path.join(paths.dir, name)
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            else:
                os.unlink(p)
