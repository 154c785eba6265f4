"""MOUNT and MOUNT_CACHED of a bucket's prefix on this node (node helpers `s3-mount`,
`s3-unmount`, `s3-flush`), with rclone's FUSE mount.

rclone, not s3fs: one binary (Debian's `rclone`) does both modes, its VFS cache is what
MOUNT_CACHED means (writes land on local disk and are uploaded behind the job's back), and its
remote-control API says how many uploads are still queued, which is what a flush waits for.
MOUNT uses `--vfs-cache-mode writes` with no write-back delay: a file written is uploaded whole
as soon as it is closed, and random writes work (rclone's streaming of unbuffered writes needs
a multipart upload of unknown size, which S3-compatible stores do not all take). MOUNT_CACHED
uses `full` (reads are cached too) with a one-second write-back. Either way a flush waits for
the uploads still queued, so a job is not reported finished before its writes are in the
bucket.

rclone's remote control is served on a Unix socket in a 0700 directory of this user's, with
no password at all: nothing secret is on its command line, in its environment or in a file,
and no other user of the node can connect (over TCP any local user could, and a leaked rc
password reads the user's AWS credentials and writes any file as them). Without a password
rclone refuses its dangerous methods anyway; `vfs/stats` is all a flush asks. Unix sockets
for the rc came with rclone 1.63 (RC_UNIX_SOCKET_SINCE): an older rclone on the node is not
used; the daemon then sends one (the request's `rclone`), or the mount fails saying which it
found.

Each mount is recorded in `<state>/mounts.json` (a MountRecord: its rclone's pid and start
time, its remote-control socket, the request that made it): unmount and flush find them there,
a mount asked for again is left as it is while its rclone lives, and `remount` makes it again
from its request.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import http.client
import json
import os
import re
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from clusterd.agent.bucket_copy import wait_for_credentials
from clusterd.agent.helper_error import HelperError
from clusterd.agent.processes import find, terminate_tree
from clusterd.node_shared.node_commands import (
    BadRequest,
    BucketFlushReply,
    BucketFlushRequest,
    BucketMountReply,
    BucketMountRequest,
    BucketUnmountReply,
    BucketUnmountRequest,
    Message,
    RcloneReply,
    RcloneRequest,
)

MOUNT_WAIT_S = 30.0
FLUSH_POLL_S = 0.5
# Uploads queued with none in progress this long fail a flush (a write-back is 1 s; a failed
# upload is retried after 1, 2, 4, 8... s).
STALLED_GRACE_S = 60.0
# mode -> (--vfs-cache-mode, --vfs-write-back)
CACHING = {"MOUNT": ("writes", "0s"), "MOUNT_CACHED": ("full", "1s")}
RC_UNIX_SOCKET_SINCE = (1, 63)
RC_TIMEOUT_S = 10.0


class MountError(HelperError):
    pass


@dataclasses.dataclass(frozen=True)
class MountRecord(Message):
    """One mount in `<state>/mounts.json` (this module's own file, read as a message: a
    record lacking a field is left out whole, and one a newer helper wrote may carry more)."""

    dest: str
    remote: str  # rclone's `:s3:bucket/prefix`
    mode: str
    params: BucketMountRequest  # what made it: `remount` makes it again from this
    pid: int  # its rclone's, with the start time that tells a recycled pid apart
    create_time: float
    rc_socket: str | None = None  # None: an older clusterd's, whose rc was on TCP
    log: str = ""

    @classmethod
    def _nested(cls, values: dict[str, Any]) -> dict[str, Any]:
        return {**values, "params": BucketMountRequest.from_dict(values["params"])}


def _records_path(state: Path) -> Path:
    return state / "mounts.json"


def _records(state: Path) -> list[MountRecord]:
    try:
        found = json.loads(_records_path(state).read_text())
    except (OSError, ValueError):
        return []
    records = []
    for record in found if isinstance(found, list) else []:
        with contextlib.suppress(BadRequest):  # not one of ours: nothing to act on
            records.append(MountRecord.from_dict(record))
    return records


def _save(state: Path, records: list[MountRecord]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    path = _records_path(state)
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump([record.to_dict() for record in records], f)
    os.replace(partial, path)


def _alive(record: MountRecord) -> bool:
    return find(record.pid, record.create_time) is not None


def _fusermount() -> str:
    for name in ("fusermount3", "fusermount"):
        found = shutil.which(name)
        if found:
            return found
    raise MountError("no fusermount on this node (install fuse3)")


def check_fuse() -> None:
    """What a FUSE mount needs, or why it cannot be had here."""
    if not os.path.exists("/dev/fuse"):
        raise MountError("this node has no /dev/fuse, so it cannot mount a bucket; use "
                         "mode: COPY, or give the node FUSE (a container needs "
                         "--device /dev/fuse)")
    _fusermount()


def rclone_version(path: str) -> tuple[int, int] | None:
    """(major, minor) of the rclone at `path`, None if it does not run or say."""
    try:
        done = subprocess.run([path, "version"], capture_output=True, text=True, timeout=30)
    except OSError:
        return None
    found = re.search(r"rclone v(\d+)\.(\d+)", done.stdout)
    return (int(found[1]), int(found[2])) if found else None


def usable_rclone(request: RcloneRequest) -> RcloneReply:
    """Node helper `s3-rclone`: which rclone a mount would use here, if any: the one the
    daemon sent (`rclone`), else the node's own if it is recent enough."""
    sent = request.rclone
    candidates = [str(Path(sent).expanduser())] if sent else []
    candidates += [found for found in (shutil.which("rclone"),) if found]
    seen: str | None = None
    for candidate in candidates:
        version = rclone_version(candidate)
        if version is not None and version >= RC_UNIX_SOCKET_SINCE:
            return RcloneReply(path=candidate, found=f"{version[0]}.{version[1]}",
                               machine=os.uname().machine)
        if version is not None and seen is None:
            seen = f"{version[0]}.{version[1]}"
    return RcloneReply(path=None, found=seen, machine=os.uname().machine)


def _rclone(sent: str | None) -> str:
    found = usable_rclone(RcloneRequest(rclone=sent))
    if found.path is None:
        since = ".".join(map(str, RC_UNIX_SOCKET_SINCE))
        what = f"rclone {found.found}" if found.found else "no rclone"
        raise MountError(f"this node has {what}; a bucket mount needs rclone {since} or "
                         "later (its remote control on a private Unix socket) and clusterd "
                         "could not send one; install rclone " + since + "+ from rclone.org "
                         "on the node, or use mode: COPY")
    return found.path


def mount(request: BucketMountRequest) -> BucketMountReply:
    """Node helper `s3-mount`."""
    state = Path(request.state).expanduser()
    dest = Path(request.dest).expanduser()
    mode = request.mode
    remote = f":s3:{request.bucket}" + (f"/{request.prefix}" if request.prefix else "")
    records = []
    for record in _records(state):
        if record.dest != str(dest):
            if _alive(record) or _gone(record):
                records.append(record)
            continue
        if _alive(record) and os.path.ismount(dest):
            if record.remote == remote and record.mode == mode:
                return BucketMountReply(dest=str(dest), already=True)
            raise MountError(f"{dest} is already a mount of {record.remote}")
        _release(record)  # its rclone died (the node rebooted, or it was killed): anew
    _save(state, records)
    check_fuse()
    rclone = _rclone(request.rclone)
    if os.path.ismount(dest):
        raise MountError(f"{dest} is already a mount point")
    dest.mkdir(parents=True, exist_ok=True)
    if any(dest.iterdir()):
        raise MountError(f"{dest} is not empty: a bucket is mounted on an empty directory")
    key = hashlib.sha256(str(dest).encode()).hexdigest()[:12]
    # rclone never makes a bucket (it would, for an upload into a missing one): which buckets
    # exist is clusterd's to say.
    env = {**os.environ, "RCLONE_S3_PROVIDER": "AWS", "RCLONE_S3_ENV_AUTH": "true",
           "RCLONE_S3_NO_CHECK_BUCKET": "true",
           "RCLONE_CONFIG": str(state / "rclone.conf")}  # an empty config of its own
    if request.region:
        env["RCLONE_S3_REGION"] = request.region
    if request.endpoint_url:
        # Another endpoint than AWS's own (an S3-compatible store, a test bed): rclone's
        # "Other" provider addresses it by path (bucket.host names resolve nowhere there).
        env["RCLONE_S3_ENDPOINT"] = request.endpoint_url
        env["RCLONE_S3_PROVIDER"] = "Other"
    if request.credentials_file:
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(Path(request.credentials_file).expanduser())
        env["AWS_EC2_METADATA_DISABLED"] = "true"
    else:
        wait_for_credentials()  # rclone would mount without them, and fail at the first read
    # A fresh 0700 directory (mkdtemp: its name cannot be foreseen, so nobody plants it),
    # short enough for a socket path wherever the state lives.
    rc_dir = tempfile.mkdtemp(prefix="clusterd-rc-")
    rc_socket = f"{rc_dir}/rc.sock"
    log_path = state / f"rclone-{key}.log"
    argv = [rclone, "mount", remote, str(dest),
            "--vfs-cache-mode", CACHING[mode][0], "--vfs-write-back", CACHING[mode][1],
            "--cache-dir", str(state / "cache" / key),
            "--dir-cache-time", "5s", "--log-file", str(log_path), "--log-level", "INFO",
            "--rc", "--rc-addr", f"unix://{rc_socket}"]
    # rclone's AWS SDK cannot take AWS_CA_BUNDLE ("unsupported transport"): its own flag can.
    ca_bundle = env.pop("AWS_CA_BUNDLE", None)
    if ca_bundle:
        argv += ["--ca-cert", ca_bundle]
    state.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True,
                                   close_fds=True, env=env)
    found = find(process.pid, None)
    record = MountRecord(dest=str(dest), remote=remote, mode=mode, params=request,
                         pid=process.pid, create_time=found.create_time() if found else 0.0,
                         rc_socket=rc_socket, log=str(log_path))
    _save(state, [*records, record])
    deadline = time.monotonic() + MOUNT_WAIT_S
    while not os.path.ismount(dest):
        if process.poll() is not None or time.monotonic() > deadline:
            with contextlib.suppress(ProcessLookupError):
                process.kill()
            shutil.rmtree(rc_dir, ignore_errors=True)
            _save(state, records)
            raise MountError(f"rclone could not mount {remote} on {dest}:\n{_tail(log_path)}")
        time.sleep(0.1)
    return BucketMountReply(dest=str(dest), already=False)


def _gone(record: MountRecord) -> bool:
    """A record whose rclone died but whose mount point is still held (a dead FUSE mount)."""
    return os.path.ismount(record.dest)


def _tail(path: Path, lines: int = 15) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str) -> None:
        super().__init__("localhost", timeout=RC_TIMEOUT_S)
        self._path = path

    def connect(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(RC_TIMEOUT_S)
        self.sock.connect(self._path)


def _rc(record: MountRecord, command: str) -> dict[str, Any]:
    if record.rc_socket is None:  # a mount of an older clusterd's, on TCP: not asked
        raise OSError("its rclone has no private remote control (mounted by an older "
                      "clusterd; unmount and mount again)")
    connection = _UnixHTTPConnection(record.rc_socket)
    try:
        connection.request("POST", f"/{command}", body=b"{}",
                           headers={"Content-Type": "application/json"})
        answer = connection.getresponse()
        body = answer.read()
    except (http.client.HTTPException, ValueError) as exc:
        raise OSError(str(exc)) from None
    finally:
        connection.close()
    if answer.status != 200:
        raise OSError(f"rclone's rc answered {answer.status}: {body[:200]!r}")
    reply: dict[str, Any] = json.loads(body)
    return reply


def upload_state(record: MountRecord) -> tuple[int, int]:
    """(uploads in progress, uploads queued) of one mount's rclone."""
    cache = _rc(record, "vfs/stats").get("diskCache") or {}
    return int(cache.get("uploadsInProgress", 0)), int(cache.get("uploadsQueued", 0))


def _last_error(record: MountRecord) -> str:
    """The last ERROR line of the mount's rclone log, without its timestamp."""
    lines = [line for line in _tail(Path(record.log), 200).splitlines()
             if " ERROR : " in line]
    return lines[-1].split(" ERROR : ", 1)[1] if lines else "no error logged"


def flush(request: BucketFlushRequest) -> BucketFlushReply:
    """Node helper `s3-flush` (and the agent, at a job's end): wait until every mount has
    uploaded what was written to it."""
    state = Path(request.state).expanduser()
    deadline = time.monotonic() + request.timeout
    grace = request.stalled_grace
    flushed = []
    for record in _records(state):
        if not _alive(record):
            continue
        stalled_since: float | None = None
        while True:
            try:
                uploading, queued = upload_state(record)
            except OSError as exc:
                raise MountError(f"cannot ask rclone of {record.dest} about its uploads: "
                                 f"{exc}") from None
            if uploading + queued == 0:
                break
            now = time.monotonic()
            # rclone retries a failed upload for ever, with backoff, and keeps it queued
            # meanwhile (its errored count stays 0): uploads queued with none in progress for
            # a while are failing, and the flush says so rather than hold the job's end for
            # the whole timeout.
            stalled_since = (stalled_since or now) if uploading == 0 else None
            if stalled_since is not None and now - stalled_since > grace:
                raise MountError(f"{record.dest}: {queued} file(s) could not be uploaded "
                                 f"to {record.remote.removeprefix(':s3:')}: "
                                 f"{_last_error(record)}")
            if now > deadline:
                raise MountError(f"{record.dest}: {uploading + queued} upload(s) still "
                                 "pending")
            time.sleep(FLUSH_POLL_S)
        flushed.append(record.dest)
    return BucketFlushReply(flushed=flushed)


def unmount_all(request: BucketUnmountRequest) -> BucketUnmountReply:
    """Node helper `s3-unmount`: unmount every recorded mount (lazily if busy) and stop its
    rclone, each flushed first (bounded) so nothing written is lost. With `keep`, the records
    stay (a node being stopped: `remount` brings them back when it starts)."""
    state = Path(request.state).expanduser()
    if not _records_path(state).exists():
        return BucketUnmountReply(unmounted=[])
    with contextlib.suppress(MountError):
        flush(BucketFlushRequest(state=str(state), timeout=request.flush_timeout,
                                 stalled_grace=request.stalled_grace))
    unmounted = []
    records = _records(state)
    for record in records:
        _release(record)
        unmounted.append(record.dest)
    _save(state, records if request.keep else [])
    return BucketUnmountReply(unmounted=unmounted)


def remount(state_dir: str) -> list[str]:
    """Mount again every mount recorded in `state_dir` whose rclone is gone (the node was
    stopped and started, or rebooted); the mount points mounted again."""
    state = Path(state_dir).expanduser()
    again: list[str] = []
    if not _records_path(state).exists():
        return again
    for record in _records(state):
        if _alive(record) and os.path.ismount(record.dest):
            continue
        if mount(record.params).already is False:
            again.append(record.dest)
    return again


def _release(record: MountRecord) -> None:
    """Unmount (lazily if busy) and stop the mount's rclone."""
    dest = record.dest
    if os.path.ismount(dest):
        fusermount = _fusermount()
        done = subprocess.run([fusermount, "-u", dest], capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run([fusermount, "-u", "-z", dest], capture_output=True, timeout=30)
    if _alive(record):
        terminate_tree(record.pid, record.create_time, grace_s=10)
    if record.rc_socket:
        shutil.rmtree(os.path.dirname(record.rc_socket), ignore_errors=True)
