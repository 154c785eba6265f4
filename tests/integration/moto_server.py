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

import pytest

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


def aws_environment(directory: Path, endpoint: str, services: tuple[str, ...],
                    monkeypatch: pytest.MonkeyPatch) -> Path:
    """This process's AWS settings, and nothing else's: a throw-away credentials file and
    config in `directory`, `services` pointed at `endpoint`, instance metadata never asked."""
    credentials = directory / "credentials"
    credentials.write_text("[default]\naws_access_key_id = testing\n"
                           "aws_secret_access_key = testing\n")
    config = directory / "config"
    config.write_text("[default]\nregion = us-east-1\n")
    for name in list(os.environ):
        if name.startswith("AWS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(credentials))
    monkeypatch.setenv("AWS_CONFIG_FILE", str(config))
    for service in services:
        monkeypatch.setenv(f"AWS_ENDPOINT_URL_{service.upper()}", endpoint)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    return directory
