"""moto's server as its own process on 127.0.0.1 (a real HTTP endpoint for EC2, STS, S3),
for the integration modules that run in a network namespace with only `lo`."""

from __future__ import annotations

import contextlib
import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

from tests.support import wait_for

IN_NETNS = "CLUSTERD_TEST_IN_NETNS"


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.contextmanager
def moto_server(scratch: Path, env: dict[str, str] | None = None) -> Iterator[str]:
    """Start moto_server, wait until it answers, yield its URL; stop it by its PID."""
    interfaces = sorted(name for _, name in socket.if_nameindex())
    assert interfaces == ["lo"], f"not in a namespace with only lo: {interfaces}"
    port = free_port()
    with open(scratch / "moto.log", "wb") as out:
        server = subprocess.Popen(
            [str(Path(sys.executable).with_name("moto_server")), "-H", "127.0.0.1", "-p",
             str(port)], stdout=out, stderr=out, start_new_session=True,
            env={**os.environ, **(env or {})})

    def answers() -> bool:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                return True
        except OSError:
            return False

    try:
        wait_for(answers, 30, "moto_server")
        yield f"http://127.0.0.1:{port}"
    finally:
        server.terminate()
        server.wait(10)
