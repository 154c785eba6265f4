"""Calls into `clusterd.agent.node` on a node, through its runner: JSON in on stdin, JSON out."""

from __future__ import annotations

import json
from typing import Any

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.runtime.runner import CommandRunner


class RuntimeMissing(ProtocolError):
    """The node has no runtime installed (yet): nothing of ours runs there."""


async def call(
    runner: CommandRunner, command: str, params: dict[str, Any], *, timeout_s: float = 120
) -> dict[str, Any]:
    result = await runner.run(
        [runner.python, "-m", "clusterd.agent.node", command, "-"],
        input=json.dumps(params).encode(),
        timeout_s=timeout_s,
    )
    try:
        reply = json.loads(result.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        if result.exit_code == 127:  # the shell found no runtime python to run
            raise RuntimeMissing(ErrorCode.PROVIDER_ERROR,
                                 f"{runner.node_name} has no clusterd runtime installed") from None
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR,
            f"{command} on {runner.node_name} failed (exit {result.exit_code}): "
            f"{result.error_tail()}",
        ) from None
    if not isinstance(reply, dict):
        raise ProtocolError(ErrorCode.PROVIDER_ERROR, f"{command}: unexpected reply {reply!r}")
    if "error" in reply:
        raise ProtocolError(
            ErrorCode.PROVIDER_ERROR, f"{command} on {runner.node_name}: {reply['error']}"
        )
    return reply
