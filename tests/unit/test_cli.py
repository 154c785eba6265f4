"""clusterctl's argument handling: options anywhere before the command, `--` ends options."""

from __future__ import annotations

import subprocess
import sys

import pytest

from clusterctl import protocol
from clusterctl._task_options import task_args
from clusterctl.cli import parse


def test_options_after_the_cluster_name() -> None:
    args = parse(["exec", "dev", "--env", "A=1", "echo", "hi"])
    assert args.cluster == "dev" and args.env == ["A=1"]
    assert args.entrypoint == ["echo", "hi"]


def test_everything_after_double_dash_is_the_command() -> None:
    args = parse(["launch", "-c", "x", "--", "python", "train.py", "--lr", "1", "-d"])
    assert args.cluster == "x" and args.detach is False
    assert args.entrypoint == ["python", "train.py", "--lr", "1", "-d"]


def test_unknown_option_before_the_command_is_an_error(capsys: pytest.CaptureFixture[str]
                                                       ) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse(["exec", "dev", "--bogus", "echo"])
    assert exit_.value.code == 2
    assert "put a command's own options after --" in capsys.readouterr().err


def test_extra_words_for_a_verb_without_a_command(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["queue", "dev", "--", "extra"])
    assert "unrecognized arguments: extra" in capsys.readouterr().err


def test_a_yaml_path_becomes_an_absolute_yaml_path(tmp_path: object) -> None:
    args = parse(["exec", "dev", "task.yaml"])
    request = task_args(args, protocol.ExecArgs, cluster="dev")
    assert request.yaml_path is not None and request.yaml_path.endswith("/task.yaml")
    assert request.yaml_path.startswith("/") and request.command is None


def test_several_words_become_one_command(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FROM_SHELL", "yes")
    args = parse(["exec", "dev", "--env", "FROM_SHELL", "--secret", "K=v", "echo", "a", "b"])
    request = task_args(args, protocol.ExecArgs, cluster="dev")
    assert request.command == "echo a b"
    assert request.envs == {"FROM_SHELL": "yes"} and request.secrets == {"K": "v"}


def test_bare_env_that_is_not_set_fails(monkeypatch: pytest.MonkeyPatch,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("NOT_SET_ANYWHERE", raising=False)
    args = parse(["exec", "dev", "--env", "NOT_SET_ANYWHERE", "true"])
    with pytest.raises(SystemExit) as exit_:
        task_args(args, protocol.ExecArgs, cluster="dev")
    assert exit_.value.code == 1
    assert "NOT_SET_ANYWHERE is not set here" in capsys.readouterr().err


def test_argparse_still_says_what_is_wrong(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        parse(["logs", "dev", "--tail"])
    err = capsys.readouterr().err
    assert "argument --tail: expected one argument" in err and "usage:" in err


def test_every_verb_parses_its_own_options() -> None:
    assert parse(["logs", "dev", "3", "--no-follow", "--tail", "5"]).tail == 5
    assert parse(["cancel", "dev", "--all"]).all is True
    assert parse(["down", "a", "b", "-y", "--purge"]).clusters == ["a", "b"]
    assert parse(["status", "--json", "-r"]).refresh is True
    assert parse(["events", "dev", "-n", "7"]).limit == 7


def test_launch_exec_and_start_take_verbose(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["launch", "-v", "-c", "dev", "--", "true"]).verbose is True
    assert parse(["launch", "-c", "dev", "--", "true"]).verbose is False
    assert parse(["exec", "dev", "--verbose", "--", "true"]).verbose is True
    assert parse(["start", "-v", "a", "b"]).verbose is True
    with pytest.raises(SystemExit):
        parse(["stop", "-v", "a"])  # nothing to time
    assert "unrecognized arguments: -v" in capsys.readouterr().err


def test_a_status_run_imports_nothing_it_does_not_need() -> None:
    """What clusterctl imports is most of its start-up time (`python -X importtime`): parsing
    a verb builds that verb's parser alone, and without shutil (5 ms); asyncio, subprocess
    and the task loader's yaml come only with the verbs that use them; typing (2 ms) with
    none: clusterctl imports it for the type checker only; socket.py (3 ms: its enums and
    selectors) with none either: the client's C `_socket` does all it needs; nor locale,
    which argparse's gettext look-ups would import (they are skipped: 1.2-1.4 ms)."""
    code = ("import sys; from clusterctl.cli import parse; parse(['status', '--json']); "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in "
            "('shutil', 'subprocess', 'asyncio', 'yaml', 'dataclasses', 'json', 'typing', "
            "'socket', 'selectors', 'locale')))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "[]"
