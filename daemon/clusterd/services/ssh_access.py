"""How a person reaches a cluster's node with OpenSSH (op `ssh`, for `clusterctl ssh`): the
options the daemon's own connection uses (address, user, key, proxy) with its host-key files,
so the user's ssh checks the key the daemon pinned. Nothing is connected here: the client runs
the system's ssh, for a real terminal, the user's agent and their own ssh_config."""

from __future__ import annotations

from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import ClusterInfo
from clusterd.ssh.config_files import SSHConfigWriter, alias
from clusterd.state.clusters import ClusterRecord


def ssh_access(record: ClusterRecord, info: ClusterInfo, index: int,
               config: SSHConfigWriter) -> dict[str, Any]:
    """`{cluster, node, node_id, alias, options}` for node `index` (0: the head) of the UP
    cluster `record`; refused for a node it does not have, one with no address, or a cluster
    on this machine (nothing to ssh to)."""
    name = record.name
    nodes = info.nodes
    if not 0 <= index < len(nodes):
        which = ", ".join(f"{i} ({'head' if i == 0 else f'worker{i}'})"
                          for i in range(len(nodes)))
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT,
                            f"cluster {name} has no node {index}; its nodes: {which or 'none'}",
                            f"e.g. clusterctl ssh {name} --node 0 (the head)")
    node = nodes[index]
    if node.ssh is None and record.provider == "local":
        raise ProtocolError(
            ErrorCode.UNSUPPORTED,
            f"cluster {name} runs on this machine (infra local): there is no node to ssh to",
            f"its jobs run in {node.workdir} here: cd there, or run a command as a job "
            f"with `clusterctl exec {name} -- CMD`")
    if node.ssh is None:
        raise ProtocolError(ErrorCode.NODE_UNREACHABLE,
                            f"node {index} of cluster {name} ({node.node_id}) has no address: "
                            f"it is {node.status}{f' ({node.reason})' if node.reason else ''}",
                            f"see `clusterctl status -r {name}`")
    return {"cluster": name, "node": index, "node_id": node.node_id,
            "alias": alias(name, index), "options": config.options(node.ssh)}
