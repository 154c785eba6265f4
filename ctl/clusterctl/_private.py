"""Directories only their owner can use: the checks clusterd, its agent and clusterctl share.

A directory clusterd keeps sockets, state or secrets in must be a real directory (not a
symbolic link), belong to the user running clusterd, and let nobody else write to it.
Anything else may have been planted, or filled, by someone else, so it is refused with an
error naming the path and the fix. Read access for others (the 0755 an older clusterd made)
is taken away, never refused: nothing can have been put there.

Standard library only and cheap (one lstat): clusterctl runs this on every start, and the
node helper on every node.
"""

from __future__ import annotations

import os
import stat

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
# Everything clusterd writes: files 0600, directories 0700.
PRIVATE_UMASK = 0o077


class UnsafePath(Exception):
    """A path clusterd will not use: who owns it, or its kind or mode, is wrong."""

    def __init__(self, path: str, problem: str, fix: str) -> None:
        super().__init__(f"{path} {problem}")
        self.path = path
        self.problem = problem
        self.fix = fix

    @property
    def message(self) -> str:
        return f"{self.path} {self.problem}"


def _owner(uid: int) -> str:
    try:
        import pwd  # only on the error path

        return f"{pwd.getpwuid(uid).pw_name} (uid {uid})"
    except (ImportError, KeyError):
        return f"uid {uid}"


def _refuse_symlink(path: str) -> UnsafePath:
    return UnsafePath(path, "is a symbolic link; clusterd keeps its sockets and state only in "
                      "real directories of your own",
                      f"remove the link (rm {path}) and let clusterd make the directory")


def _refuse_owner(path: str, owner: int, uid: int) -> UnsafePath:
    return UnsafePath(path, f"belongs to {_owner(owner)}, not to you ({_owner(uid)}); "
                      "someone else may have made it to catch your clusterd's traffic",
                      f"have it removed (as root: rm -r {path}), or point clusterd elsewhere "
                      "(XDG_RUNTIME_DIR, XDG_STATE_HOME, CLUSTERD_SOCKET)")


def _refuse_mode(path: str, mode: int) -> UnsafePath:
    return UnsafePath(path, f"has mode {mode:04o}: others may write there, and may have left "
                      "something for clusterd to use", f"check what is in it, then chmod 700 "
                      f"{path}")


def check_private_dir(path: str, uid: int | None = None) -> None:
    """Raise UnsafePath unless `path` is a real directory of `uid` (default: ours) that
    nobody else can write to. FileNotFoundError if it does not exist. Read-only: this is
    the client's check of the daemon's socket directory."""
    uid = os.getuid() if uid is None else uid
    info = os.lstat(path)
    if stat.S_ISLNK(info.st_mode):
        raise _refuse_symlink(path)
    if not stat.S_ISDIR(info.st_mode):
        raise UnsafePath(path, "is not a directory", f"move it away (rm {path})")
    if info.st_uid != uid:
        raise _refuse_owner(path, info.st_uid, uid)
    if info.st_mode & 0o022:
        raise _refuse_mode(path, stat.S_IMODE(info.st_mode))


def ensure_private_dir(path: str) -> str:
    """Make `path` (its parents as needed) a directory only we can use, or check that it is
    one: a symbolic link, another owner, or write access for others is refused (something
    may have been planted); read access for others (an older clusterd's 0755) is taken away,
    since nothing can have been put there. Returns the path."""
    parent = os.path.dirname(path.rstrip("/"))
    if parent:
        os.makedirs(parent, exist_ok=True)
    try:
        os.mkdir(path, PRIVATE_DIR_MODE)
    except FileExistsError:
        pass
    try:
        # Opened, not looked up again: what is checked is what gets fixed.
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError as exc:
        if os.path.islink(path):
            raise _refuse_symlink(path) from None
        if not os.path.isdir(path):
            raise UnsafePath(path, "is not a directory", f"move it away (rm {path})") from None
        raise exc
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid():
            raise _refuse_owner(path, info.st_uid, os.getuid())
        mode = stat.S_IMODE(info.st_mode)
        if mode & 0o022:
            raise _refuse_mode(path, mode)
        if mode != PRIVATE_DIR_MODE:
            os.fchmod(fd, PRIVATE_DIR_MODE)
    finally:
        os.close(fd)
    return path


def write_private_file(path: str, data: bytes) -> None:
    """Replace `path` with `data`, mode 0600 from the start (never readable by others, even
    for a moment), atomically."""
    tmp = f"{path}.tmp-{os.getpid()}"
    try:
        os.unlink(tmp)  # left by a crash: O_EXCL below must make a fresh file
    except FileNotFoundError:
        pass
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, PRIVATE_FILE_MODE)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
