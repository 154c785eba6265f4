"""What the agent's gRPC server admits: calls with the daemon's credential, of bounded size and
number. The daemon's needs set the bounds: a job spec is a task file (at most 4 MiB) plus its
variables; a reply is at most a queue listing (bounded by the agent's job retention) or a 1 MiB
log chunk; concurrent calls are the daemon's log followers plus a few quick calls each."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeAlias

import grpc

from clusterd.node_shared.auth import AUTH_METADATA, NonceBook, credential_is_valid

# What a caller needs before it can make a credential: nothing in them is worth anything
# without the token.
OPEN_METHODS = frozenset({
    "/clusterd.agent.v1.HealthService/Handshake",
    "/clusterd.agent.v1.HealthService/IssueNonces",
})
MAX_REQUEST_BYTES = 16 * 1024 * 1024
MAX_REPLY_BYTES = 32 * 1024 * 1024
MAX_METADATA_BYTES = 16 * 1024
MAX_CONCURRENT_RPCS = 256

SERVER_OPTIONS = [
    ("grpc.max_receive_message_length", MAX_REQUEST_BYTES),
    ("grpc.max_send_message_length", MAX_REPLY_BYTES),
    ("grpc.max_metadata_size", MAX_METADATA_BYTES),
    ("grpc.so_reuseport", 0),
]
REFUSED = ("no valid credential: only the daemon that started this agent may call it, with a "
           "credential good for one call over a nonce this agent issued a moment ago")


if TYPE_CHECKING:  # the stubs make these generic; grpc's classes are not subscriptable
    Handler: TypeAlias = grpc.RpcMethodHandler[Any, Any]
    Interceptor: TypeAlias = grpc.aio.ServerInterceptor[Any, Any]
else:
    Handler = grpc.RpcMethodHandler
    Interceptor = grpc.aio.ServerInterceptor


class TokenGuard(Interceptor):
    """Refuses (UNAUTHENTICATED) every call but Handshake and IssueNonces that lacks a
    credential made from the cluster's token over an unused nonce of `nonces` (see auth.py).
    It refuses before the call's handler runs, so a refused call did nothing."""

    def __init__(self, token: str, nonces: NonceBook) -> None:
        self._token = token
        self._nonces = nonces

    async def intercept_service(
        self,
        continuation: Callable[[grpc.HandlerCallDetails], Awaitable[Handler]],
        details: grpc.HandlerCallDetails,
    ) -> Handler:
        handler = await continuation(details)
        if handler is None or details.method in OPEN_METHODS:
            return handler
        metadata = dict(details.invocation_metadata or ())
        if credential_is_valid(self._token, metadata.get(AUTH_METADATA), self._nonces):
            return handler
        return _refusal(handler)


def _refusal(handler: Handler) -> Handler:
    """A handler of the same shape as `handler` that only refuses."""

    async def unary(request: Any, context: Any) -> Any:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)

    async def stream(request: Any, context: Any) -> AsyncIterator[Any]:
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, REFUSED)
        yield  # pragma: no cover - abort raises

    kwargs = {"request_deserializer": handler.request_deserializer,
              "response_serializer": handler.response_serializer}
    if handler.request_streaming:
        raise AssertionError("the agent has no client-streaming calls")
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    return grpc.unary_unary_rpc_method_handler(unary, **kwargs)
