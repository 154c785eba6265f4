"""Commands on nodes, as both ways of reaching one share them: what running a command gives
back (`CommandResult`) and how files are copied (rsync, honouring .skyignore/.gitignore).

The local runner (runtime/runner.py) and the SSH runner (ssh/runner.py) both build on this
module, which imports neither.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from clusterctl.protocol import ErrorCode, ProtocolError

SKYIGNORE = ".skyignore"
RSYNC_FILTERS = (
    # As SkyPilot: a .skyignore in the directory wins, else .gitignore rules apply.
    f"--filter=:- {SKYIGNORE}",
)


@dataclasses.dataclass(frozen=True)
class CommandResult:
    exit_code: int
    stdout: bytes
    stderr: bytes

    @property
    def text(self) -> str:
        return self.stdout.decode(errors="replace")

    def error_tail(self, lines: int = 15) -> str:
        text = (self.stderr or self.stdout).decode(errors="replace").rstrip()
        return "\n".join(text.splitlines()[-lines:])


def rsync_binary() -> str:
    found = shutil.which("rsync")
    if found is None:
        raise ProtocolError(
            ErrorCode.UNSUPPORTED,
            "rsync is not installed on this machine; it is needed to copy workdirs and mounts",
            "install it (Debian: apt-get install rsync)",
        )
    return found


def ignore_filters(source: str) -> list[str]:
    has_skyignore = os.path.exists(os.path.join(source, SKYIGNORE))
    return list(RSYNC_FILTERS) if has_skyignore else ["--filter=:- .gitignore"]


def workdir_rsync_args(source: str) -> list[str]:
    """A workdir copy's rsync options: the destination made to match, ignore rules applied.
    The copy and the count of what it sends (rsync.planned) both use these."""
    return ["-a", "--delete", *ignore_filters(source)]


def mount_rsync_args() -> list[str]:
    """A file mount's rsync options: everything, nothing at the destination removed."""
    return ["-a"]


def rsync_source(source: str) -> str:
    """A directory's contents (trailing slash), or the file itself."""
    return source.rstrip("/") + "/" if os.path.isdir(source) else source


def real(path: str) -> str:
    """The path as the file system resolves it: `~` expanded, symlinks followed."""
    return os.path.realpath(os.path.expanduser(path))


def inside(path: str, directory: str) -> bool:
    """Whether `path` is `directory` or under it, once both are resolved (real)."""
    path, directory = real(path), real(directory)
    return path == directory or path.startswith(directory.rstrip("/") + "/")
