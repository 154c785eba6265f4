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
used; the daemon then sends one (param `rclone`), or the mount fails saying which it found.

Each mount is recorded in `<state>/mounts.json` (its rclone's pid and start time, its
remote-control socket): unmount and flush find them there, and a mount asked for again is left
as it is while its rclone lives.
"""

from __future__ import annotations

import contextlib
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

from clusterd.agent.bucket_copy import CopyError, wait_for_credentials
from clusterd.agent.processes import find, terminate_tree

MOUNT_WAIT_S = 30.0
FLUSH_POLL_S = 0.5
# Uploads queued with none in progress this long fail a flush (a write-back is 1 s; a failed
# upload is retried after 1, 2, 4, 8... s).
STALLED_GRACE_S = 60.0
# mode -> (--vfs-cache-mode, --vfs-write-back)
CACHING = {"MOUNT": ("writes", "0s"), "MOUNT_CACHED": ("full", "1s")}
RC_UNIX_SOCKET_SINCE = (1, 63)
RC_TIMEOUT_S = 10.0


class MountError(Exception):
    pass


def _records_path(state: Path) -> Path:
    return state / "mounts.json"


def _records(state: Path) -> list[dict[str, Any]]:
    try:
        found: list[dict[str, Any]] = json.loads(_records_path(state).read_text())
    except (OSError, ValueError):
        return []
    return found


def _save(state: Path, records: list[dict[str, Any]]) -> None:
    state.mkdir(parents=True, exist_ok=True)
    path = _records_path(state)
    partial = path.with_suffix(".tmp")
    fd = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(records, f)
    os.replace(partial, path)


def _alive(record: dict[str, Any]) -> bool:
    return find(int(record["pid"]), float(record["create_time"])) is not None


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


def usable_rclone(params: dict[str, Any]) -> dict[str, Any]:
    """Node helper `s3-rclone`: which rclone a mount would use here, if any: the one the
    daemon sent (`rclone`), else the node's own if it is recent enough."""
    sent = params.get("rclone")
    candidates = [str(Path(str(sent)).expanduser())] if sent else []
    candidates += [found for found in (shutil.which("rclone"),) if found]
    seen: str | None = None
    for candidate in candidates:
        version = rclone_version(candidate)
        if version is not None and version >= RC_UNIX_SOCKET_SINCE:
            return {"path": candidate, "found": f"{version[0]}.{version[1]}",
                    "machine": os.uname().machine}
        if version is not None and seen is None:
            seen = f"{version[0]}.{version[1]}"
    return {"path": None, "found": seen, "machine": os.uname().machine}


def _rclone(params: dict[str, Any]) -> str:
    found = usable_rclone(params)
    if found["path"] is None:
        since = ".".join(map(str, RC_UNIX_SOCKET_SINCE))
        what = f"rclone {found['found']}" if found["found"] else "no rclone"
        raise MountError(f"this node has {what}; a bucket mount needs rclone {since} or "
                         "later (its remote control on a private Unix socket) and clusterd "
                         "could not send one; install rclone " + since + "+ from rclone.org "
                         "on the node, or use mode: COPY")
    return str(found["path"])


def mount(params: dict[str, Any]) -> dict[str, Any]:
    state = Path(str(params["state"])).expanduser()
    dest = Path(str(params["dest"])).expanduser()
    mode = str(params["mode"])
    remote = f":s3:{params['bucket']}" + (f"/{params['prefix']}" if params.get("prefix") else "")
    records = []
    for record in _records(state):
        if record["dest"] != str(dest):
            if _alive(record) or _gone(record):
                records.append(record)
            continue
        if _alive(record) and os.path.ismount(dest):
            if record["remote"] == remote and record["mode"] == mode:
                return {"dest": str(dest), "already": True}
            raise MountError(f"{dest} is already a mount of {record['remote']}")
        _release(record)  # its rclone died (the node rebooted, or it was killed): anew
    _save(state, records)
    check_fuse()
    rclone = _rclone(params)
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
    if params.get("region"):
        env["RCLONE_S3_REGION"] = str(params["region"])
    if params.get("endpoint_url"):
        # Another endpoint than AWS's own (an S3-compatible store, a test bed): rclone's
        # "Other" provider addresses it by path (bucket.host names resolve nowhere there).
        env["RCLONE_S3_ENDPOINT"] = str(params["endpoint_url"])
        env["RCLONE_S3_PROVIDER"] = "Other"
    if params.get("credentials_file"):
        env["AWS_SHARED_CREDENTIALS_FILE"] = str(Path(params["credentials_file"]).expanduser())
        env["AWS_EC2_METADATA_DISABLED"] = "true"
    else:
        try:  # rclone would mount without them, and fail at the first read
            wait_for_credentials(params)
        except CopyError as exc:
            raise MountError(str(exc)) from None
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
    record = {"dest": str(dest), "remote": remote, "mode": mode, "params": params,
              "pid": process.pid,
              "create_time": found.create_time() if found else 0.0,
              "rc_socket": rc_socket, "log": str(log_path)}
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
    return {"dest": str(dest), "already": False}


def _gone(record: dict[str, Any]) -> bool:
    """A record whose rclone died but whose mount point is still held (a dead FUSE mount)."""
    return os.path.ismount(record["dest"])


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


def _rc(record: dict[str, Any], command: str) -> dict[str, Any]:
    if "rc_socket" not in record:  # a mount of an older clusterd's, on TCP: not asked
        raise OSError("its rclone has no private remote control (mounted by an older "
                      "clusterd; unmount and mount again)")
    connection = _UnixHTTPConnection(record["rc_socket"])
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


def upload_state(record: dict[str, Any]) -> tuple[int, int]:
    """(uploads in progress, uploads queued) of one mount's rclone."""
    cache = _rc(record, "vfs/stats").get("diskCache") or {}
    return int(cache.get("uploadsInProgress", 0)), int(cache.get("uploadsQueued", 0))


def _last_error(record: dict[str, Any]) -> str:
    """The last ERROR line of the mount's rclone log, without its timestamp."""
    lines = [line for line in _tail(Path(record.get("log", "")), 200).splitlines()
             if " ERROR : " in line]
    return lines[-1].split(" ERROR : ", 1)[1] if lines else "no error logged"


def flush(params: dict[str, Any]) -> dict[str, Any]:
    """Wait until every mount has uploaded what was written to it."""
    state = Path(str(params["state"])).expanduser()
    deadline = time.monotonic() + float(params.get("timeout", 3600))
    grace = float(params.get("stalled_grace", STALLED_GRACE_S))
    flushed = []
    for record in _records(state):
        if not _alive(record):
            continue
        stalled_since: float | None = None
        while True:
            try:
                uploading, queued = upload_state(record)
            except OSError as exc:
                raise MountError(f"cannot ask rclone of {record['dest']} about its uploads: "
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
                raise MountError(f"{record['dest']}: {queued} file(s) could not be uploaded "
                                 f"to {record['remote'].removeprefix(':s3:')}: "
                                 f"{_last_error(record)}")
            if now > deadline:
                raise MountError(f"{record['dest']}: {uploading + queued} upload(s) still "
                                 "pending")
            time.sleep(FLUSH_POLL_S)
        flushed.append(record["dest"])
    return {"flushed": flushed}


def unmount_all(params: dict[str, Any]) -> dict[str, Any]:
    """Unmount every recorded mount (lazily if busy) and stop its rclone, each flushed first
    (bounded) so nothing written is lost. With `keep`, the records stay (a node being
    stopped: `remount` brings them back when it starts)."""
    state = Path(str(params["state"])).expanduser()
    if not _records_path(state).exists():
        return {"unmounted": []}
    with contextlib.suppress(MountError):
        flush({"state": str(state), "timeout": float(params.get("flush_timeout", 300)),
               "stalled_grace": float(params.get("stalled_grace", 20))})
    unmounted = []
    records = _records(state)
    for record in records:
        _release(record)
        unmounted.append(record["dest"])
    _save(state, records if params.get("keep") else [])
    return {"unmounted": unmounted}


def remount(params: dict[str, Any]) -> dict[str, Any]:
    """Mount again every recorded mount whose rclone is gone (the node was stopped and
    started, or rebooted)."""
    state = Path(str(params["state"])).expanduser()
    again: list[str] = []
    if not _records_path(state).exists():
        return {"remounted": again}
    for record in _records(state):
        if _alive(record) and os.path.ismount(record["dest"]):
            continue
        if mount(record["params"])["already"] is False:
            again.append(record["dest"])
    return {"remounted": again}


def _release(record: dict[str, Any]) -> None:
    """Unmount (lazily if busy) and stop the mount's rclone."""
    dest = record["dest"]
    if os.path.ismount(dest):
        fusermount = _fusermount()
        done = subprocess.run([fusermount, "-u", dest], capture_output=True, timeout=30)
        if done.returncode != 0:
            subprocess.run([fusermount, "-u", "-z", dest], capture_output=True, timeout=30)
    if _alive(record):
        terminate_tree(int(record["pid"]), float(record["create_time"]), grace_s=10)
    if record.get("rc_socket"):
        shutil.rmtree(os.path.dirname(record["rc_socket"]), ignore_errors=True)
