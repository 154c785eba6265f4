"""LogKeeper's rounds against a scripted agent: copies grow by what the log gained, a round cut
off mid-stream resumes from the copy's length (nothing lost or doubled), and a copy is marked
complete only once the job has ended and all of its log is copied."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from clusterctl.protocol import ClusterStatus, JobStatus, ProtocolError
from clusterd.keptlogs.keeper import LogKeeper
from clusterd.keptlogs.store import Caps, KeptLogStore
from clusterd.runtime.agent_types import Job, LogChunk
from clusterd.state.clusters import ClusterRecord
from clusterd.tasks.spec import ResourceRequest


@dataclasses.dataclass
class ScriptedAgent:
    log: bytearray = dataclasses.field(default_factory=bytearray)
    status: JobStatus = JobStatus.RUNNING
    break_after: int | None = None  # chunks sent before the stream breaks (once)
    reads: list[tuple[int, bool]] = dataclasses.field(default_factory=list)

    async def queue(self, skip_finished: bool = False) -> list[Job]:
        return [Job(1, "job", "me", self.status, 1.0, 1.0, None, "1x", 1, "/d", "", (), "t")]

    async def tail(self, job_id: int, *, follow: bool, tail_lines: int, offset: int
                   ) -> AsyncIterator[LogChunk]:
        self.reads.append((offset, follow))
        sent = 0
        while offset < len(self.log):
            if self.break_after is not None and sent == self.break_after:
                self.break_after = None
                raise ProtocolError("AGENT_UNREACHABLE", "the stream broke")
            chunk = bytes(self.log[offset:offset + 3])
            offset += len(chunk)
            sent += 1
            yield LogChunk(job_id, chunk, offset, False, None, "")
        yield LogChunk(job_id, b"", offset, True, self.status, "")


class ScriptedAccess:
    def __init__(self, agent: ScriptedAgent) -> None:
        self.agent = agent

    async def client(self, record: ClusterRecord) -> ScriptedAgent:
        return self.agent

    async def reset(self, cluster: str) -> None:
        pass


CREATED = time.time()


def record() -> ClusterRecord:
    return ClusterRecord("c", "local", "c-000000", ClusterStatus.UP, 1, ResourceRequest(), "h",
                         CREATED, CREATED)


def keeper(tmp_path: Path, agent: ScriptedAgent) -> LogKeeper:
    access: Any = ScriptedAccess(agent)
    return LogKeeper(None, access, KeptLogStore(tmp_path, Caps(10_000, 100_000, 10)),  # type: ignore[arg-type]
                     interval_s=0.1, last_round_s=5)


def copied(keeper: LogKeeper) -> tuple[bytes, bool]:
    (directory,) = keeper.kept.incarnations("c")
    return (keeper.kept.files(directory).read(1, 0, 1_000_000),
            keeper.kept.jobs(directory)[1].complete)


def test_rounds_copy_what_the_log_gained_and_complete_it_once_the_job_ended(
        tmp_path: Path) -> None:
    agent = ScriptedAgent(bytearray(b"one\ntwo\n"))
    first = keeper(tmp_path, agent)
    assert anyio.run(first.copy_round, record()) is True  # still running
    assert copied(first) == (b"one\ntwo\n", False)
    agent.log += b"three\n"
    agent.status = JobStatus.SUCCEEDED
    assert anyio.run(first.copy_round, record()) is False
    assert copied(first) == (b"one\ntwo\nthree\n", True)
    # The finished job's log was read with follow (to its very end), from the copy's end.
    assert agent.reads == [(0, False), (8, True)]
    # A keeper made afresh (a restarted daemon) leaves a complete copy alone.
    assert anyio.run(keeper(tmp_path, agent).copy_round, record()) is False
    assert len(agent.reads) == 2 and copied(first) == (b"one\ntwo\nthree\n", True)


def test_a_round_cut_off_mid_stream_resumes_without_loss_or_doubling(tmp_path: Path) -> None:
    text = b"".join(b"line %d\n" % i for i in range(20))
    agent = ScriptedAgent(bytearray(text), JobStatus.SUCCEEDED, break_after=5)
    first = keeper(tmp_path, agent)
    with pytest.raises(ProtocolError):
        anyio.run(first.copy_round, record())
    assert copied(first) == (text[:15], False)
    second = keeper(tmp_path, agent)  # as after a kill -9
    assert anyio.run(second.copy_round, record()) is False
    assert copied(second) == (text, True)
    assert agent.reads[-1] == (15, True)
