"""Which files of a local directory go to a bucket: the ones the workdir sync would send.

rsync itself lists them, with the workdir sync's own filters (commands.ignore_filters:
.skyignore, else .gitignore), so both obey the same rules without a second implementation
of them. As with `rsync -a`, links are not followed out of the tree: S3 holds no links, so a
link to a file inside the tree is uploaded as that file, and any other link (out of the tree,
to a directory, dangling) is left out and named in `skipped_links`.
"""

from __future__ import annotations

import dataclasses
import tempfile
from pathlib import Path

import anyio

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.commands import ignore_filters, rsync_binary

LIST_TIMEOUT_S = 600.0
# rsync's itemized change (`%i`) is 11 characters: its second says what the entry is.
ITEM_WIDTH = 11


@dataclasses.dataclass(frozen=True)
class LocalTree:
    files: tuple[tuple[Path, str], ...]  # (the file to read, its path relative to the root)
    skipped_links: tuple[str, ...]


async def files_to_upload(source: str) -> LocalTree:
    root = Path(source).resolve()
    if not root.is_dir():
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"{source} is not a directory",
                            "a bucket's `source:` is a local directory or a bucket URL")
    with tempfile.TemporaryDirectory(prefix="clusterd-list-") as empty:
        with anyio.fail_after(LIST_TIMEOUT_S):
            done = await anyio.run_process(
                [rsync_binary(), "-rl", "--dry-run", "--out-format=%i %n",
                 *ignore_filters(str(root)), f"{root}/", f"{empty}/"], check=False)
    if done.returncode != 0:
        raise ProtocolError(ErrorCode.INVALID_ARGUMENT, f"cannot list {source}: "
                            f"{done.stderr.decode(errors='replace').strip()[-500:]}",
                            "check that every file under it is readable")
    files: list[tuple[Path, str]] = []
    links: list[str] = []
    for line in done.stdout.decode(errors="surrogateescape").splitlines():
        kind, relative = line[1:2], line[ITEM_WIDTH + 1:]
        if kind == "f":
            files.append((root / relative, relative))
        elif kind == "L":
            links.append(relative)
    # A link counts only if what it leads to is itself sent: an ignored file stays home.
    sent = {path for path, _ in files}
    skipped: list[str] = []
    for relative in links:
        target = (root / relative).resolve()
        if target in sent:
            files.append((target, relative))
        else:
            skipped.append(relative)
    return LocalTree(tuple(files), tuple(skipped))
