"""The kept copies of jobs' logs on this machine (keptlogs/store.py): resumable by length,
caps per job and per cluster, and the history of torn-down clusters."""

from __future__ import annotations

import stat
from pathlib import Path

from clusterd.keptlogs.store import Caps, KeptCluster, KeptJob, KeptLogStore


def store_in(tmp_path: Path, job: int = 1000, cluster: int = 10_000, history: int = 10
             ) -> KeptLogStore:
    return KeptLogStore(tmp_path / "kept", Caps(job, cluster, history))


def cluster(name: str = "c", created_at: float = 100.0) -> KeptCluster:
    return KeptCluster(name=name, provider="local", infra="local", created_at=created_at)


def test_copies_are_private_and_resume_at_their_length(tmp_path: Path) -> None:
    kept = store_in(tmp_path)
    directory = kept.remember(cluster())
    job = KeptJob(1, status="RUNNING")
    kept.note_job(directory, job)
    kept.append(directory, job, b"one\n")
    kept.append(directory, job, b"two\n")
    assert kept.resume_offset(directory, job) == 8
    assert kept.files(directory).read(1, 0) == b"one\ntwo\n"
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    for path in directory.iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o600, path


def test_over_the_job_cap_the_oldest_part_goes_and_the_copy_says_so(tmp_path: Path) -> None:
    kept = store_in(tmp_path, job=1000)
    directory = kept.remember(cluster())
    job = KeptJob(1, status="RUNNING")
    kept.note_job(directory, job)
    written = b"".join(b"line %04d\n" % i for i in range(300))  # 3000 bytes
    for start in range(0, len(written), 100):
        kept.append(directory, job, written[start:start + 100])
    copy = kept.files(directory).read(1, 0, 1_000_000)
    first, _, rest = copy.partition(b"\n")
    dropped = int(first.split(b"the first ")[1].split(b" ")[0])
    assert first.startswith(b"[clusterd: the first ") and b"under 1 KB" in first
    # What is kept is exactly the log from the dropped count on, starting at a line.
    assert rest == written[dropped:] and rest.startswith(b"line ")
    assert len(copy) <= 1000 + len(first) + 1
    # Resuming goes on where the log (not the copy) ends.
    assert kept.resume_offset(directory, kept.jobs(directory)[1]) == len(written)


def test_a_job_whose_output_looks_like_the_header_is_not_misread(tmp_path: Path) -> None:
    kept = store_in(tmp_path)
    directory = kept.remember(cluster())
    job = KeptJob(1)
    fake = b"[clusterd: the first 999 bytes of this log were dropped]\n"
    kept.append(directory, job, fake)
    assert kept.resume_offset(directory, job) == len(fake)


def test_over_the_cluster_cap_the_oldest_finished_copies_go_first(tmp_path: Path) -> None:
    kept = store_in(tmp_path, job=1000, cluster=2500)
    directory = kept.remember(cluster())
    jobs = [KeptJob(1, status="RUNNING"), KeptJob(2, status="SUCCEEDED", complete=True),
            KeptJob(3, status="SUCCEEDED", complete=True), KeptJob(4, status="RUNNING")]
    for job in jobs:
        kept.note_job(directory, job)
        kept.append(directory, job, b"x" * 800)
    noted = kept.jobs(directory)
    # 3200 bytes over 2500: job 2 (the oldest finished one) went; job 1 runs on.
    assert "under 2.5 KB" in noted[2].dropped and not noted[2].complete
    assert not kept.files(directory).path(2).exists()
    assert [i for i, j in noted.items() if not j.dropped] == [1, 3, 4]


def test_history_lists_torn_down_clusters_newest_first_and_forgets_the_oldest(
        tmp_path: Path) -> None:
    kept = store_in(tmp_path, history=2)
    for number in range(3):
        directory = kept.remember(cluster(f"c{number}", created_at=100.0 + number))
        job = KeptJob(1, status="RUNNING")
        kept.note_job(directory, job)
        kept.append(directory, job, b"hello\n")
        kept.close_out(directory, "TERMINATED", "torn down by request 7", 200.0 + number)
    live = kept.remember(cluster("up", created_at=500.0))
    rows = kept.history(None, 10)
    assert [c.name for c, _ in rows] == ["c2", "c1"]  # c0 is past the limit of 2
    assert not (kept.root / cluster("c0", 100.0).key).exists()
    assert live.exists()  # not torn down: not in the history, and never pruned
    (only, jobs), = kept.history("c2", 10)
    assert only.reason == "torn down by request 7" and only.torn_down_at == 202.0
    assert [(j.status, j.complete) for j in jobs] == [("CANCELLED", False)]
    assert "while the job ran" in jobs[0].failure_reason


def test_a_closed_out_incarnation_is_not_closed_again(tmp_path: Path) -> None:
    kept = store_in(tmp_path)
    directory = kept.remember(cluster())
    kept.close_out(directory, "TERMINATED", "first", 1.0)
    kept.close_out(directory, "TERMINATED", "second", 2.0)
    assert kept.cluster(directory) == KeptCluster(
        name="c", provider="local", infra="local", created_at=100.0, status="TERMINATED",
        torn_down_at=1.0, reason="first")
