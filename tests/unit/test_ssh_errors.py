"""asyncssh's errors become the daemon's in clusterd.ssh.errors: the code, the reason, and the
dead connection dropped before the error is raised."""

from __future__ import annotations

import asyncssh
import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import SSHTarget
from clusterd.ssh import errors

TARGET = SSHTarget("10.0.0.7", 2222, "ubuntu", "/k/id")


@pytest.mark.anyio
async def test_a_transport_error_in_the_block_is_dropped_then_mapped() -> None:
    dropped: list[str] = []

    async def drop() -> None:
        dropped.append("dropped")

    for raised in (ConnectionResetError("reset by peer"),
                   asyncssh.ConnectionLost("connection lost")):
        with pytest.raises(ProtocolError) as caught:
            async with errors.mapped(lambda exc: errors.connection_lost(TARGET, exc), drop):
                raise raised
        assert caught.value.code == ErrorCode.NODE_UNREACHABLE
        assert str(TARGET) in caught.value.message
        assert str(raised) in caught.value.message
        assert caught.value.__cause__ is None and caught.value.__suppress_context__
    assert dropped == ["dropped", "dropped"]


@pytest.mark.anyio
async def test_other_errors_pass_through_and_drop_nothing() -> None:
    async def drop() -> None:
        raise AssertionError("dropped for an error that is not the transport's")

    with pytest.raises(KeyError):
        async with errors.mapped(lambda exc: errors.connection_lost(TARGET, exc), drop):
            raise KeyError("not ssh")
    async with errors.mapped(lambda exc: errors.connection_lost(TARGET, exc), drop):
        pass


def test_a_refused_key_says_so_and_other_failures_say_the_host_is_unreachable() -> None:
    refused = errors.cannot_connect(TARGET, asyncssh.PermissionDenied("no such key"))
    assert refused.code == ErrorCode.NODE_UNREACHABLE
    assert "refused our key: no such key" in refused.message
    assert "identity_file" in refused.hint
    timed_out = errors.cannot_connect(TARGET, TimeoutError())
    assert timed_out.message == f"cannot reach {TARGET}: TimeoutError"
    assert "sshd listens" in timed_out.hint
