"""Calls into `clusterd.agent.node` on a node, through its runner: JSON in on stdin, JSON out.

`call` sends a typed request (node_shared/node_commands.py) and reads its typed reply; the
node helper reads and writes the same types. Nothing else runs the node helper.
"""

from __future__ import annotations

import json
from typing import Any, TypeVar

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.node_shared.node_commands import BadRequest, Message, Request
from clusterd.runtime.runner import CommandRunner

R = TypeVar("R", bound=Message)


class RuntimeMissing(ProtocolError):
    """The node has no runtime installed (yet): nothing of ours runs there."""


async def call(runner: CommandRunner, request: Request[R], *, timeout_s: float = 120) -> R:
    """Run the request's command on the runner's node; its reply, typed."""
    reply = await _call_json(runner, request.command, request.to_dict(), timeout_s=timeout_s)
    try:
        return request.read_reply(reply)
    except BadRequest as exc:
        raise ProtocolError(ErrorCode.PROVIDER_ERROR,
                            f"{request.command} on {runner.node_name}: {exc}") from None


async def _call_json(
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
