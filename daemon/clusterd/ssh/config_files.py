"""`ssh CLUSTER` and `ssh CLUSTER-worker1`: an OpenSSH config file per cluster, included from
~/.ssh/config, with the same host keys the daemon checks (its pins, then the user's own
known_hosts). Removed on down. Values are quoted; one that could break out of its line (a
newline, a quote) is refused, never written."""

from __future__ import annotations

import os
from pathlib import Path

from clusterctl._private import ensure_private_dir
from clusterd.nodes import NodeInfo


def quoted(value: str) -> str:
    """A value for ssh_config, in double quotes (OpenSSH splits its lines as a shell would)."""
    if any(c in value for c in '"\n\r\0'):
        raise ValueError(f"{value[:80]!r} cannot be written to an ssh config file")
    return f'"{value}"'


class SSHConfigWriter:
    def __init__(self, directory: Path, known_hosts: Path) -> None:
        self.directory = directory
        self._known_hosts = known_hosts

    @property
    def include_line(self) -> str:
        return f"Include {self.directory}/*"

    def write(self, cluster: str, nodes: list[NodeInfo]) -> None:
        blocks = []
        for index, node in enumerate(nodes):
            if node.ssh is None:
                continue
            alias = cluster if index == 0 else f"{cluster}-worker{index}"
            lines = [
                f"Host {alias}",
                f"  HostName {quoted(node.ssh.host)}",
                f"  Port {int(node.ssh.port)}",
                f"  User {quoted(node.ssh.user)}",
                f"  UserKnownHostsFile {quoted(str(self._known_hosts))} "
                f"{quoted(os.path.expanduser('~/.ssh/known_hosts'))}",
                "  StrictHostKeyChecking yes",
            ]
            if node.ssh.host_key_alias:
                lines.append(f"  HostKeyAlias {quoted(node.ssh.host_key_alias)}")
            if node.ssh.proxy_command:
                # The rest of the line is the command, as written (quotes would be its own).
                quoted(node.ssh.proxy_command)  # no newline: it cannot end the line early
                lines.append(f"  ProxyCommand {node.ssh.proxy_command}")
            if node.ssh.identity_file:
                lines += [f"  IdentityFile {quoted(node.ssh.identity_file)}",
                          "  IdentitiesOnly yes"]
            blocks.append("\n".join(lines))
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
