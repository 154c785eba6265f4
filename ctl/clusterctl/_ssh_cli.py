"""`clusterctl ssh CLUSTER [CMD...]`: a login (or CMD) on a cluster's node through the system's
own `ssh`, so a terminal, the user's agent and their ssh_config all work as with any host.
The daemon says how it reaches the node (op `ssh`: address, user, key, proxy and its host-key
files); this process becomes ssh with those as `-o` options. Imported only when `ssh` runs."""

from __future__ import annotations

import os
import sys

from clusterctl import protocol
from clusterctl._fail import fail

TYPE_CHECKING = False  # typing, for the type checker alone
if TYPE_CHECKING:
    import argparse
    from collections.abc import Sequence
    from typing import Any

    from clusterctl.client import Client

SSH = "ssh"


def add_options(ssh: argparse.ArgumentParser) -> None:
    ssh.description = (
        "Runs your ssh with the options clusterd reaches the node with (address, user, key, "
        "proxy, and the host key it pinned), so your ssh_config, agent and terminal work as "
        "with any host. The exit code is the command's (255: ssh could not connect). Plain "
        "`ssh CLUSTER`, `ssh CLUSTER-worker1`, scp and rsync work too: clusterd includes its "
        "hosts in ~/.ssh/config. A local cluster has no node to ssh to.")
    ssh.add_argument("cluster")
    ssh.add_argument("--node", type=int, default=0, metavar="N",
                     help="which node: 0 the head (default), N the Nth worker")
    # `entrypoint`, as launch's and exec's: words after `--` join it whatever they look like.
    ssh.add_argument("entrypoint", nargs="*", metavar="COMMAND",
                     help="run this instead of a login shell (after --: words that start "
                          "with a dash are the command's)")


def ssh_argv(access: dict[str, Any], command: Sequence[str]) -> list[str]:
    """The ssh command line the daemon's answer makes: each option as `-o`, then `--` (a
    command that starts with a dash is not ssh's option), the node's alias, the command."""
    argv = [SSH]
    for option in access["options"]:
        argv += ["-o", str(option)]
    return [*argv, "--", str(access["alias"]), *command]


def main(client: Client, args: argparse.Namespace) -> int:
    if args.node < 0:
        fail("--node must be ≥ 0", f"0 is the head of {args.cluster}, 1 its first worker")
    access = client.call(protocol.SSHArgs(cluster=args.cluster, node=args.node))
    client.close()  # ssh needs nothing of the daemon's once it knows the way
    argv = ssh_argv(access, args.entrypoint)
    sys.stdout.flush()
    sys.stderr.flush()
    try:
        os.execvp(SSH, argv)  # the exit code is then ssh's: the command's, or 255
    except OSError as exc:
        fail(f"cannot run ssh: {exc.strerror}",
             "install OpenSSH's client (Debian: apt-get install openssh-client)")
