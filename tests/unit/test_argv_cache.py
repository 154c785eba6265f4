"""clusterctl keeps what a command line parsed to (_argv_cache.py): the same words, with the
same code, are not parsed again, and argparse is not even imported; anything else (other words,
changed code, a file that is not its own) is parsed as ever."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import msgpack
import pytest

from clusterctl import _argv_cache
from clusterctl.cli import parse


@pytest.fixture
def cache_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path / "clusterd"


def kept(words: list[str]) -> dict[str, object] | None:
    _argv_cache.keep(words, parse(words))
    recalled = _argv_cache.recall(words)
    return None if recalled is None else vars(recalled)


def test_a_command_line_parsed_once_is_recalled_as_parsed(cache_home: Path) -> None:
    words = ["exec", "dev", "--env", "A=1", "--num-nodes", "2", "--", "echo", "hi"]
    assert _argv_cache.recall(words) is None
    assert kept(words) == vars(parse(words))
    assert kept(["launch", "-i", "2.5", "--", "true"])["idle_minutes"] == 2.5  # type: ignore[index]
    assert _argv_cache.recall(["exec", "dev", "--", "echo", "hi"]) is None  # other words
    file = cache_home / _argv_cache.FILE_NAME
    assert oct(file.stat().st_mode & 0o777) == "0o600"
    assert oct(cache_home.stat().st_mode & 0o777) == "0o700"


def test_changed_code_is_a_miss(cache_home: Path, tmp_path: Path,
                                monkeypatch: pytest.MonkeyPatch) -> None:
    package = tmp_path / "package"
    package.mkdir()
    (package / "cli.py").write_text("# one\n")
    monkeypatch.setattr(_argv_cache, "_PACKAGE", str(package))
    assert kept(["status"]) is not None
    (package / "cli.py").write_text("# one, and more\n")
    assert _argv_cache.recall(["status"]) is None
    assert kept(["status"]) is not None
    (package / "_new_verbs.py").write_text("")
    assert _argv_cache.recall(["status"]) is None


def test_at_most_the_latest_lines_are_kept(cache_home: Path) -> None:
    for index in range(_argv_cache.MAX_LINES + 5):
        _argv_cache.keep(["queue", f"c{index}"], parse(["queue", f"c{index}"]))
    assert _argv_cache.recall(["queue", "c0"]) is None
    assert _argv_cache.recall(["queue", f"c{_argv_cache.MAX_LINES + 4}"]) is not None
    assert _argv_cache.recall(["queue", "c5"]) is not None
    # Used again, a line is the newest: kept while others go.
    _argv_cache.keep(["queue", "c5"], parse(["queue", "c5"]))
    for index in range(100, 100 + _argv_cache.MAX_LINES - 1):
        _argv_cache.keep(["queue", f"c{index}"], parse(["queue", f"c{index}"]))
    assert _argv_cache.recall(["queue", "c5"]) is not None
    assert _argv_cache.recall(["queue", "c6"]) is None


def test_values_msgpack_would_change_and_the_dashboard_are_not_kept(cache_home: Path) -> None:
    args = parse(["status"])
    args.clusters = ("a", "b")  # a tuple would come back a list
    _argv_cache.keep(["status"], args)
    assert _argv_cache.recall(["status"]) is None
    _argv_cache.keep(["dashboard"], parse(["dashboard"]))
    assert _argv_cache.recall(["dashboard"]) is None


def test_a_file_that_is_not_its_own_is_a_miss(cache_home: Path) -> None:
    assert kept(["status"]) is not None
    file = cache_home / _argv_cache.FILE_NAME
    good = file.read_bytes()
    for spoiled in (b"\xc1 not msgpack", msgpack.packb([1, 2]),
                    msgpack.packb({"fingerprint": ["another"], "lines": {"status": {}}})):
        file.write_bytes(spoiled)
        assert _argv_cache.recall(["status"]) is None
    file.write_bytes(good)
    cache_home.chmod(0o777)  # others could have written it
    assert _argv_cache.recall(["status"]) is None
    cache_home.chmod(0o700)
    file.unlink()
    file.symlink_to(cache_home / "elsewhere")
    assert _argv_cache.recall(["status"]) is None


def ctl(cache: Path, *words: str) -> subprocess.CompletedProcess[str]:
    """clusterctl as a user runs it, with no daemon to talk to."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache), "CLUSTERD_NO_AUTOSTART": "1",
           "CLUSTERD_SOCKET": str(cache / "none.sock")}
    return subprocess.run([sys.executable, "-c", "from clusterctl.cli import main; main()",
                           *words], env=env,
                          capture_output=True, text=True, timeout=60)


def test_a_recalled_command_line_runs_as_a_parsed_one_without_argparse(
        tmp_path: Path) -> None:
    first = ctl(tmp_path, "queue", "dev", "--json")
    assert (tmp_path / "clusterd" / _argv_cache.FILE_NAME).exists()
    again = ctl(tmp_path, "queue", "dev", "--json")
    assert (first.returncode, first.stdout, first.stderr) == \
        (again.returncode, again.stdout, again.stderr)
    assert first.returncode == 1 and "cannot reach clusterd" in first.stderr, first.stderr
    code = ("import sys; from clusterctl import _argv_cache; "
            "args = _argv_cache.recall(['queue', 'dev', '--json']); "
            "print(*args.clusters, args.json, 'argparse' in sys.modules)")
    recalled = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              env={**os.environ, "XDG_CACHE_HOME": str(tmp_path)}, timeout=60)
    assert recalled.stdout.split() == ["dev", "True", "False"], recalled.stderr
    # Errors are never kept: each run parses, and says the same.
    for _ in range(2):
        bad = ctl(tmp_path, "logs")
        assert bad.returncode == 2 and "the following arguments are required" in bad.stderr
    assert _argv_cache.recall(["logs"]) is None


@pytest.mark.parametrize("words", [
    ["launch", "--secret", "K=hunter2", "--", "true"],
    ["launch", "--secret=K=hunter2", "--", "true"],
    ["launch", "--sec", "K=hunter2", "--", "true"],  # argparse's abbreviation
    ["jobs", "launch", "--secret", "K", "--", "true"],  # from the environment: still not kept
    ["exec", "dev", "--env", "GIT_TOKEN=hunter2", "--", "true"],
    ["exec", "dev", "--env", "REPO=https://u:hunter2@host/x", "--", "true"],
    ["exec", "dev", "--", "git", "clone", "https://hunter2@host/x"],
    ["jobs", "launch", "--", "git clone ssh://u:hunter2@host/x && ls"],
])
def test_a_command_line_that_may_carry_a_secret_is_never_kept(
        cache_home: Path, words: list[str]) -> None:
    assert kept(["status"]) is not None  # the file exists, so what follows could land in it
    assert kept(words) is None
    assert b"hunter2" not in (cache_home / _argv_cache.FILE_NAME).read_bytes()
    assert kept(["exec", "dev", "--env", "REPO=https://host/x", "--", "true"]) is not None
