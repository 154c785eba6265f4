"""`ssh CLUSTER` and `ssh CLUSTER-worker1`: an OpenSSH config file per cluster, included from
~/.ssh/config, with the same host keys the daemon checks (its pins, then the user's own
known_hosts). Removed on down. `clusterctl ssh` gets the same options over the socket (op
`ssh`), and works whether or not the file is included. Values are quoted; one that could break
out of its line (a newline, a quote) is refused, never written."""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl._private import ensure_private_dir
from clusterd.nodes import NodeInfo, SSHTarget


def quoted(value: str) -> str:
    """A value for ssh_config, in double quotes (OpenSSH splits its lines as a shell would)."""
    if any(c in value for c in '"\n\r\0'):
        raise ValueError(f"{value[:80]!r} cannot be written to an ssh config file")
    return f'"{value}"'


def alias(cluster: str, index: int) -> str:
    """What `ssh` calls a cluster's node: the cluster's name for its head, NAME-workerN for
    the others."""
    return cluster if index == 0 else f"{cluster}-worker{index}"


def host_options(target: SSHTarget, known_hosts: Path) -> list[str]:
    """OpenSSH options that reach `target` as the daemon does (its address, user, key, proxy)
    and check its host key against the same files, as ssh_config lines ("Keyword value"):
    the body of a Host block, or `ssh -o LINE` each (ssh parses both alike)."""
    lines = [
        f"HostName {quoted(target.host)}",
        f"Port {int(target.port)}",
        f"User {quoted(target.user)}",
        f"UserKnownHostsFile {quoted(str(known_hosts))} "
        f"{quoted(os.path.expanduser('~/.ssh/known_hosts'))}",
        "StrictHostKeyChecking yes",
    ]
    if target.host_key_alias:
        lines.append(f"HostKeyAlias {quoted(target.host_key_alias)}")
    if target.proxy_command:
        # The rest of the line is the command, as written (quotes would be its own).
        quoted(target.proxy_command)  # no newline: it cannot end the line early
        lines.append(f"ProxyCommand {target.proxy_command}")
    if target.identity_file:
        lines += [f"IdentityFile {quoted(target.identity_file)}", "IdentitiesOnly yes"]
    return lines


class SSHConfigWriter:
    def __init__(self, directory: Path, known_hosts: Path) -> None:
        self.directory = directory
        self._known_hosts = known_hosts

    @property
    def include_line(self) -> str:
        return f"Include {self.directory}/*"

    def options(self, target: SSHTarget) -> list[str]:
        """`target`'s Host block, as `ssh -o` options (see host_options)."""
        return host_options(target, self._known_hosts)

    def write(self, cluster: str, nodes: list[NodeInfo]) -> None:
        blocks = [
            "\n".join([f"Host {alias(cluster, index)}",
                       *(f"  {line}" for line in self.options(node.ssh))])
            for index, node in enumerate(nodes) if node.ssh is not None
        ]
        if not blocks:
            return
        ensure_private_dir(str(self.directory))
        path = self.directory / cluster
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"# Written by clusterd for cluster {cluster}; removed on down.\n")
            f.write("\n\n".join(blocks) + "\n")
        self._ensure_included()

    def remove(self, cluster: str) -> None:
        (self.directory / cluster).unlink(missing_ok=True)

    def _ensure_included(self) -> None:
        ssh_dir = Path.home() / ".ssh"
        ssh_dir.mkdir(mode=0o700, exist_ok=True)
        config = ssh_dir / "config"
        try:
            text = config.read_text()
        except FileNotFoundError:
            text = ""
        if self.include_line in text.splitlines():
            return
        # An Include applies to the Host blocks that follow it, so it goes first.
        fd = os.open(config, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(f"# Added by clusterd: `ssh CLUSTER` for your clusters.\n"
                    f"{self.include_line}\n\n{text}")
