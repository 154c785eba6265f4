"""The checks on directories clusterd keeps sockets and state in (clusterctl._private)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from clusterctl._private import (
    UnsafePath,
    check_private_dir,
    ensure_private_dir,
    write_private_file,
)


def test_made_0700_when_missing(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    ensure_private_dir(str(target))
    assert target.stat().st_mode & 0o777 == 0o700
    check_private_dir(str(target))


def test_a_symlink_is_refused_and_its_target_untouched(tmp_path: Path) -> None:
    real = tmp_path / "real"
    real.mkdir(mode=0o755)
    real.chmod(0o755)
    link = tmp_path / "link"
    link.symlink_to(real)
    for check in (check_private_dir, ensure_private_dir):
        with pytest.raises(UnsafePath) as error:
            check(str(link))
        assert "symbolic link" in error.value.message and str(link) in error.value.message
        assert f"rm {link}" in error.value.fix
    assert real.stat().st_mode & 0o777 == 0o755  # never chmod'ed through the link


def test_writable_by_others_is_refused_with_the_fix(tmp_path: Path) -> None:
    loose = tmp_path / "loose"
    loose.mkdir()
    loose.chmod(0o777)
    for check in (check_private_dir, ensure_private_dir):
        with pytest.raises(UnsafePath) as error:
            check(str(loose))
        assert "mode 0777" in error.value.message
        assert error.value.fix.endswith(f"chmod 700 {loose}")
    assert loose.stat().st_mode & 0o777 == 0o777


def test_readable_by_others_is_tightened(tmp_path: Path) -> None:
    old = tmp_path / "old"
    old.mkdir()
    old.chmod(0o755)  # what an older clusterd made
    check_private_dir(str(old))  # the client's read-only check lets it be
    ensure_private_dir(str(old))
    assert old.stat().st_mode & 0o777 == 0o700


def test_a_file_is_refused(tmp_path: Path) -> None:
    plain = tmp_path / "plain"
    plain.write_text("x")
    with pytest.raises(UnsafePath, match="not a directory"):
        ensure_private_dir(str(plain))


def test_another_owner_is_refused(tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to give a directory away")
    theirs = tmp_path / "theirs"
    theirs.mkdir(mode=0o700)
    os.chown(theirs, 65534, 65534)
    for check in (check_private_dir, ensure_private_dir):
        with pytest.raises(UnsafePath) as error:
            check(str(theirs))
        assert "belongs to nobody (uid 65534)" in error.value.message
        assert "rm -r" in error.value.fix


def test_private_file_is_0600_and_replaced_atomically(tmp_path: Path) -> None:
    target = tmp_path / "token"
    write_private_file(str(target), b"one")
    write_private_file(str(target), b"two")
    assert target.read_bytes() == b"two"
    assert target.stat().st_mode & 0o777 == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["token"]
