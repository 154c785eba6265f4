"""What a bucket upload takes from a local directory: what the workdir sync would send
(.skyignore, else .gitignore), and no link followed out of the tree."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl.protocol import ProtocolError
from clusterd.storage.local_tree import files_to_upload

pytestmark = pytest.mark.anyio


def make_tree(tmp_path: Path, ignore_file: str) -> Path:
    outside = tmp_path / "private"
    outside.mkdir()
    (outside / "id_rsa").write_text("secret\n")
    root = tmp_path / "src"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("a\n")
    (root / "sub" / "b.txt").write_text("b\n")
    (root / "run.log").write_text("ignored\n")
    (root / ignore_file).write_text("*.log\n")
    os.symlink(outside / "id_rsa", root / "key")          # a file out of the tree
    os.symlink("../private", root / "sub" / "more")       # a directory out of the tree
    os.symlink("a.txt", root / "alias")                   # a file in the tree
    os.symlink("run.log", root / "log-alias")             # an ignored file in the tree
    os.symlink("nowhere", root / "dangling")
    return root


@pytest.mark.parametrize("ignore_file", [".skyignore", ".gitignore"])
async def test_only_what_the_workdir_sync_sends_and_no_link_out(tmp_path: Path,
                                                                ignore_file: str) -> None:
    root = make_tree(tmp_path, ignore_file)
    tree = await files_to_upload(str(root))
    sent = {relative: path.read_text() for path, relative in tree.files}
    assert sent == {"a.txt": "a\n", "sub/b.txt": "b\n", "alias": "a\n",
                    ignore_file: "*.log\n"}
    assert sorted(tree.skipped_links) == ["dangling", "key", "log-alias", "sub/more"]


async def test_skyignore_wins_over_gitignore(tmp_path: Path) -> None:
    root = make_tree(tmp_path, ".gitignore")
    (root / ".skyignore").write_text("a.txt\n")
    names = {relative for _, relative in (await files_to_upload(str(root))).files}
    assert "run.log" in names and "a.txt" not in names


async def test_a_source_that_is_no_directory_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProtocolError, match="is not a directory"):
        await files_to_upload(str(tmp_path / "absent"))
