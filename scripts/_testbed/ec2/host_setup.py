"""What the EC2 test bed changes on the machine itself, outside its directory: the `ubuntu` user
every node logs in as and its sudoers file, and the mount points nodes use. Its network
namespace and its registry of live beds (EC2_BEDS) are in common/host.py, shared with the
Kubernetes bed. Standard library only."""

from __future__ import annotations

import contextlib
import os
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
from _testbed.common.host import mounts_under
from _testbed.ec2.layout import NODE_DISK, NODE_HOME, NODE_MOUNT, NODE_USER, BedPaths

SUDOERS_FILE = "/etc/sudoers.d/clusterd-testbed-ubuntu"
SUDOERS = f"# the clusterd EC2 test bed's nodes (scripts/testbed ec2)\n" \
          f"{NODE_USER} ALL=(ALL:ALL) NOPASSWD: ALL\n"
GECOS = "clusterd testbed ec2"  # marks the ubuntu user as the test bed's
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
