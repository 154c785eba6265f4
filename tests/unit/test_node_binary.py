"""A static binary sent to a node (runtime/node_binary.py: uv, before any Python is there):
kept only if what arrived has the digest computed here, sent once, with nothing but sh and
coreutils on the node."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pytest

from clusterctl.protocol import ProtocolError
from clusterd.commands import CommandResult
from clusterd.runtime.node_binary import send_binary
from clusterd.runtime.runner import LocalRunner


class Link(LocalRunner):
    """A node; `change` alters what is streamed to it (a link that tampers with it)."""

    def __init__(self, scratch: Path, change: bool = False) -> None:
        super().__init__()
        self.scratch, self.change, self.streamed = scratch, change, 0

    async def run(self, argv: Sequence[str], *, input: bytes | Path | None = None,
                  timeout_s: float = 120) -> CommandResult:
        if isinstance(input, Path):
            self.streamed += 1
            if self.change:
                changed = self.scratch / "changed"
                changed.write_bytes(input.read_bytes() + b"\0planted")
                input = changed
        return await super().run(argv, input=input, timeout_s=timeout_s)


@pytest.fixture
def binary(tmp_path: Path) -> Path:
    path = tmp_path / "tool"
    path.write_bytes(b"#!/bin/sh\necho tool\n")
    return path


@pytest.mark.anyio
async def test_a_binary_is_kept_once_and_sent_once(tmp_path: Path, binary: Path) -> None:
    link = Link(tmp_path)
    target = tmp_path / "node" / ".clusterd" / "bin" / "tool"
    await send_binary(link, binary, str(target))
    assert target.read_bytes() == binary.read_bytes() and target.stat().st_mode & 0o777 == 0o700
    await send_binary(link, binary, str(target))
    assert link.streamed == 1  # there with its digest: not sent again


@pytest.mark.anyio
async def test_a_binary_changed_on_the_way_is_not_kept(tmp_path: Path, binary: Path) -> None:
    target = tmp_path / "node" / "tool"
    with pytest.raises(ProtocolError, match="exit 3"):
        await send_binary(Link(tmp_path, change=True), binary, str(target))
    assert not target.exists() and not (tmp_path / "node" / "tool.part").exists()
