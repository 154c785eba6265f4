"""`ssh CLUSTER` and `ssh CLUSTER-worker1`: an OpenSSH config file per cluster, included from
~/.ssh/config, with the same pinned host keys the daemon uses. Removed on down."""

from __future__ import annotations

import os
from pathlib import Path

from clusterd.providers.base import NodeInfo


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
                f"  HostName {node.ssh.host}",
                f"  Port {node.ssh.port}",
                f"  User {node.ssh.user}",
                f"  UserKnownHostsFile {self._known_hosts}",
                "  StrictHostKeyChecking yes",
            ]
            if node.ssh.host_key_alias:
                lines.append(f"  HostKeyAlias {node.ssh.host_key_alias}")
            if node.ssh.proxy_command:
                lines.append(f"  ProxyCommand {node.ssh.proxy_command}")
            if node.ssh.identity_file:
                lines += [f"  IdentityFile {node.ssh.identity_file}", "  IdentitiesOnly yes"]
            blocks.append("\n".join(lines))
        if not blocks:
            return
        self.directory.mkdir(mode=0o700, parents=True, exist_ok=True)
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
