"""The daemon's agent client against a scripted agent (a real gRPC server on a Unix socket,
which holds the token): what it does with nonces it cannot use."""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator

import anyio
import grpc
import pytest

from clusterctl._version import __version__
from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.agent.v1 import agent_pb2 as pb
from clusterd.agent.v1 import agent_pb2_grpc as pb_grpc
from clusterd.node_shared.auth import agent_proof, new_nonce, new_token
from clusterd.node_shared.wire import AGENT_PROTOCOL
from clusterd.runtime.agent_client import AgentClient
from tests.support import short_tempdir

pytestmark = pytest.mark.anyio
TOKEN = new_token()


class ShortLivedNonces(pb_grpc.HealthServiceServicer):  # type: ignore[misc]
    """Proves the token, then issues nonces whose lifetime is over before they can be used."""

    def __init__(self, ttl_s: float) -> None:
        self.ttl_s = ttl_s
        self.issued = 0

    async def Handshake(self, request: pb.HandshakeRequest, context: object
                        ) -> pb.HandshakeResponse:
        server_nonce = new_nonce()
        return pb.HandshakeResponse(
            server_nonce=server_nonce, proof=agent_proof(TOKEN, request.client_nonce,
                                                         server_nonce),
            version=__version__, protocol=AGENT_PROTOCOL)

    async def IssueNonces(self, request: pb.IssueNoncesRequest, context: object
                          ) -> pb.IssueNoncesResponse:
        self.issued += 1
        return pb.IssueNoncesResponse(nonces=[new_nonce()], ttl_s=self.ttl_s)


@pytest.fixture
async def endpoint() -> AsyncIterator[str]:
    root = short_tempdir("cdnc-")
    try:
        yield f"unix:{root}/agent.sock"
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.mark.parametrize("ttl_s", [1e-9, 0.0, float("nan"), -1.0, 1e12])
async def test_nonces_that_cannot_be_used_are_a_clear_error_not_a_loop(
        endpoint: str, ttl_s: float) -> None:
    agent = ShortLivedNonces(ttl_s)
    server = grpc.aio.server()
    pb_grpc.add_HealthServiceServicer_to_server(agent, server)
    server.add_insecure_port(endpoint)
    await server.start()
    client = AgentClient("c", endpoint, TOKEN)
    try:
        with anyio.fail_after(10), pytest.raises(ProtocolError) as refused:
            await client.health()
        assert refused.value.code == ErrorCode.AGENT_UNREACHABLE
        assert "nonce" in refused.value.message
        assert agent.issued <= 3
    finally:
        await client.close()
        await server.stop(None)
