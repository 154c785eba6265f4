"""Kept copies of jobs' logs, on this machine, and the history of torn-down clusters.

One directory per cluster *incarnation* (`NAME@CREATED_MS`: a cluster made again under the
same name starts its job ids afresh), private (0700, files 0600), holding

* `cluster.json`: its name, provider and infra, when it was made, launched and torn down,
  and why (the history's row);
* `jobs.json`: each job's name, status, failure reason, and whether its copy is complete
  (the job had ended and every byte of its log is here) or dropped (over the caps);
* `ID.log`: the copy itself, written through `JobLogFiles` (as managed jobs' logs are).

A copy is a prefix of the job's log on the head, so its length is where copying resumes (the
agent's log offsets): a daemon killed mid-copy loses and doubles nothing. Over the per-job
cap, the oldest part is dropped (down to half the cap, so that a long log is not rewritten
at every chunk) and a first line says how much; the count in that line keeps the offset
right. Over the per-cluster cap, the oldest jobs' copies go first (finished ones first).

The JSON files are replaced whole (write, then rename): a reader never sees half of one.
Every function here blocks on file I/O: the daemon calls them from a worker thread, one
caller per incarnation at a time (LogKeeper holds a lock per cluster).
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from clusterctl._private import ensure_private_dir
from clusterd.managed.joblog import CHUNK_BYTES, JobLogFiles

CLUSTER_FILE = "cluster.json"
JOBS_FILE = "jobs.json"
_HEADER = re.compile(rb"\[clusterd: the first (\d+) bytes of this log were dropped[^\n]*\n")
# After a cut, the copy starts at a line if one starts this close to the cut point.
_LINE_SEARCH = 64 * 1024


def human(size: int) -> str:
    value = float(size)
    for unit in ("bytes", "KB", "MB"):
        if value < 1000:
            return f"{value:.3g} {unit}"
        value /= 1000
    return f"{value:.3g} GB"


@dataclasses.dataclass(frozen=True)
class Caps:
    job_bytes: int  # 0: no copies are kept
    cluster_bytes: int
    history: int  # torn-down clusters remembered; older ones (and their copies) go


@dataclasses.dataclass
class KeptJob:
    job_id: int
    name: str = ""
    status: str = "PENDING"
    submitted_at: float | None = None
    ended_at: float | None = None
    failure_reason: str = ""
    complete: bool = False
    cut: bool = False  # the copy lost its start to the job cap (its first line says so)
    dropped: str = ""  # why the whole copy went (the cluster cap)
    # When it held nodes, and how many: what the cost report splits a cluster's cost by.
    started_at: float | None = None
    num_nodes: int = 1

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


@dataclasses.dataclass
class KeptCluster:
    """A cluster incarnation's row in the history."""

    name: str
    provider: str
    infra: str
    created_at: float
    launched_at: float | None = None
    status: str = "UP"
    torn_down_at: float | None = None
    reason: str = ""

    @property
    def key(self) -> str:
        return f"{self.name}@{int(self.created_at * 1000)}"


class KeptLogStore:
    def __init__(self, root: Path, caps: Caps) -> None:
        self.root = root
        self.caps = caps

    @property
    def enabled(self) -> bool:
        return self.caps.job_bytes > 0

    # -- clusters --------------------------------------------------------------------------

    def remember(self, cluster: KeptCluster) -> Path:
        """The incarnation's directory (made if new), with its row written if it changed."""
        directory = self.root / cluster.key
        if not directory.exists():
            ensure_private_dir(str(self.root))
            ensure_private_dir(str(directory))
        if self.cluster(directory) != cluster:
            _write_json(directory / CLUSTER_FILE, dataclasses.asdict(cluster))
        return directory

    def cluster(self, directory: Path) -> KeptCluster | None:
        data = _read_json(directory / CLUSTER_FILE)
        return KeptCluster(**data) if data else None

    def incarnations(self, name: str | None = None) -> list[Path]:
        """Directories (of one cluster name, or all), newest made first."""
        if not self.root.is_dir():
            return []
        found = []
        for entry in self.root.iterdir():
            base, at, stamp = entry.name.rpartition("@")
            if at and stamp.isdigit() and (name is None or base == name):
                found.append((int(stamp), entry))
        return [path for _, path in sorted(found, reverse=True)]

    def latest(self, name: str) -> Path | None:
        found = self.incarnations(name)
        return found[0] if found else None

    def close_out(self, directory: Path, status: str, reason: str,
                  torn_down_at: float | None) -> None:
        """The cluster stopped (or went, at `torn_down_at`): jobs its copy saw unfinished are
        over too, their copies incomplete."""
        cluster = self.cluster(directory)
        if cluster is None or cluster.torn_down_at is not None:
            return  # an incarnation gone already (the newer one never came up)
        cluster = dataclasses.replace(cluster, status=status, reason=reason,
                                      torn_down_at=torn_down_at)
        _write_json(directory / CLUSTER_FILE, dataclasses.asdict(cluster))
        jobs = self.jobs(directory)
        for job in jobs.values():
            if not job.complete and job.status not in _TERMINAL:
                # The agent cancels its jobs when its cluster stops or goes; a copy cannot
                # tell more of how a job ended once its head is gone.
                job.status = "CANCELLED"
                job.failure_reason = f"the cluster went {status.lower()} while the job ran" \
                    f" ({reason})"
        self._write_jobs(directory, jobs)
        if torn_down_at is not None:
            self._prune_history()

    def history(self, name: str | None, limit: int) -> list[tuple[KeptCluster, list[KeptJob]]]:
        """Torn-down incarnations, newest first."""
        rows = []
        for directory in self.incarnations(name):
            cluster = self.cluster(directory)
            if cluster is None or cluster.torn_down_at is None:
                continue
            rows.append((cluster, sorted(self.jobs(directory).values(),
                                         key=lambda j: j.job_id)))
            if len(rows) >= limit:
                break
        rows.sort(key=lambda row: row[0].torn_down_at or 0, reverse=True)
        return rows

    def _prune_history(self) -> None:
        gone = [d for d in self.incarnations()
                if (c := self.cluster(d)) is not None and c.torn_down_at is not None]
        gone.sort(key=lambda d: os.stat(d / CLUSTER_FILE).st_mtime, reverse=True)
        for directory in gone[self.caps.history:]:
            shutil.rmtree(directory, ignore_errors=True)

    # -- jobs ------------------------------------------------------------------------------

    def jobs(self, directory: Path) -> dict[int, KeptJob]:
        data = _read_json(directory / JOBS_FILE) or {}
        return {int(k): KeptJob(**v) for k, v in data.items()}

    def note_job(self, directory: Path, job: KeptJob) -> None:
        jobs = self.jobs(directory)
        if jobs.get(job.job_id) != job:
            jobs[job.job_id] = job
            self._write_jobs(directory, jobs)

    def files(self, directory: Path) -> JobLogFiles:
        return JobLogFiles(directory)

    def resume_offset(self, directory: Path, job: KeptJob) -> int:
        """Where copying the job's log goes on: the agent's offset of the copy's end."""
        try:
            size = self.files(directory).size(job.job_id)
        except FileNotFoundError:
            return 0
        dropped, header = self.dropped(directory, job)
        return dropped + size - header

    def dropped(self, directory: Path, job: KeptJob) -> tuple[int, int]:
        """(bytes dropped from the start of the job's log, length of the line saying so)."""
        if not job.cut:
            return 0, 0
        head = self.files(directory).read(job.job_id, 0, 512)
        found = _HEADER.match(head)
        return (int(found.group(1)), found.end()) if found else (0, 0)

    def append(self, directory: Path, job: KeptJob, data: bytes) -> None:
        """`data` after the copy's end; then the caps are enforced."""
        files = self.files(directory)
        if not files.path(job.job_id).exists():
            files.create(job.job_id)  # 0600 whatever the umask
        files.append(job.job_id, data)
        cap = min(self.caps.job_bytes, self.caps.cluster_bytes)
        if files.size(job.job_id) > cap:
            self._cut(directory, job, cap)
        self._fit_cluster(directory, job)

    def _cut(self, directory: Path, job: KeptJob, cap: int) -> None:
        """Drop the oldest part, keeping about half the cap (from a line start if one is
        near), behind a first line that says how much went."""
        if not job.cut:
            job.cut = True  # written before the file changes: its header is then believed
            self.note_job(directory, job)
        files = self.files(directory)
        path = files.path(job.job_id)
        dropped, header = self.dropped(directory, job)
        content = files.size(job.job_id) - header
        start = header + content - cap // 2
        near = files.read(job.job_id, start, _LINE_SEARCH)
        newline = near.find(b"\n")
        if newline >= 0:
            start += newline + 1
        dropped += start - header
        line = (f"[clusterd: the first {dropped} bytes of this log were dropped to keep "
                f"its kept copy under {human(cap)}]\n").encode()
        temporary = path.with_suffix(".cut")
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "wb") as out:
            out.write(line)
            offset = start
            while chunk := files.read(job.job_id, offset, CHUNK_BYTES * 16):
                out.write(chunk)
                offset += len(chunk)
        os.replace(temporary, path)

    def _fit_cluster(self, directory: Path, current: KeptJob) -> None:
        """Over the cluster's cap: drop whole copies, the oldest finished jobs' first."""
        files = self.files(directory)
        sizes = {}
        for path in directory.glob("*.log"):
            if path.stem.isdigit():
                sizes[int(path.stem)] = path.stat().st_size
        total = sum(sizes.values())
        if total <= self.caps.cluster_bytes:
            return
        jobs = self.jobs(directory)
        order = sorted((i for i in sizes if i != current.job_id),
                       key=lambda i: (i in jobs and jobs[i].status not in _TERMINAL, i))
        for job_id in order:
            if total <= self.caps.cluster_bytes:
                break
            total -= sizes[job_id]
            files.path(job_id).unlink(missing_ok=True)
            job = jobs.setdefault(job_id, KeptJob(job_id))
            job.dropped = (f"dropped to keep the cluster's kept logs under "
                           f"{human(self.caps.cluster_bytes)}")
            job.complete = False
        self._write_jobs(directory, jobs)

    def _write_jobs(self, directory: Path, jobs: dict[int, KeptJob]) -> None:
        _write_json(directory / JOBS_FILE, {str(k): v.to_json() for k, v in sorted(jobs.items())})


_TERMINAL = frozenset({"SUCCEEDED", "FAILED", "FAILED_SETUP", "FAILED_DRIVER", "CANCELLED"})


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except FileNotFoundError:
        return None


def _write_json(path: Path, data: Any) -> None:
    temporary = path.with_suffix(".tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        json.dump(data, out)
    os.replace(temporary, path)
