"""`clusterctl completion bash|zsh|fish`: scripts made from the parser complete its verbs,
actions, options, choices and (from `clusterctl completion --cluster-names`) cluster names, in
each real shell. bash runs its completion function as bash-completion would; fish answers
`complete -C`; zsh runs its function with compsys's builtins (`_describe`, `compadd`,
`_files`) replaced by ones that print what they were given."""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

import pytest

from clusterctl._completion_grammar import CLUSTERS, FILES, NOTHING, grammar
from clusterctl._completion_scripts import SCRIPTS
from clusterctl._parser import VERBS, build_parser
from tests.support import needs_tool

NAMES = ("dev", "demo", "train")


@pytest.fixture(scope="module")
def scripts(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Each shell's script, and on PATH a `clusterctl` that knows three clusters (what a
    running clusterd would say)."""
    root = tmp_path_factory.mktemp("completion")
    made = grammar(build_parser())
    paths = {}
    for shell, script in SCRIPTS.items():
        paths[shell] = root / f"clusterctl.{shell}"
        paths[shell].write_text(script(made))
    fake = root / "bin" / "clusterctl"
    fake.parent.mkdir()
    fake.write_text('#!/bin/sh\n[ "$*" = "completion --cluster-names" ] && '
                    f"printf '%s\\n' {' '.join(NAMES)}\n")
    fake.chmod(0o755)
    return paths


def env(scripts: dict[str, Path]) -> dict[str, str]:
    return {**os.environ, "PATH": f"{scripts['bash'].parent / 'bin'}:{os.environ['PATH']}",
            "HOME": str(scripts["bash"].parent)}


def bash(scripts: dict[str, Path], line: str) -> set[str]:
    """What bash offers for the last word of `line` (a trailing space: an empty word)."""
    words = line.split(" ")
    code = ('source "$1"; shift; COMP_WORDS=("$@"); COMP_CWORD=$(( $# - 1 )); _clusterctl; '
            'printf "%s\\n" "${COMPREPLY[@]}"')
    out = subprocess.run(["bash", "-c", code, "_", str(scripts["bash"]), *words],
                         capture_output=True, text=True, check=True, env=env(scripts),
                         cwd=scripts["bash"].parent).stdout
    return set(out.split())


def fish(scripts: dict[str, Path], line: str) -> set[str]:
    needs_tool("fish", "fish")
    out = subprocess.run(["fish", "--no-config", "-c",
                          f"source {scripts['fish']}; complete -C '{line}'"],
                         capture_output=True, text=True, check=True, env=env(scripts),
                         cwd=scripts["fish"].parent).stdout
    return {entry.split("\t")[0] for entry in out.splitlines()}


ZSH_STUBS = """
_describe() { print -l -- "${(@P)4}" }
compadd() { shift; print -l -- "$@" }
_files() { print -- @FILES }
"""


def zsh(scripts: dict[str, Path], line: str) -> set[str]:
    """What zsh's function hands compsys (which then keeps those the word starts)."""
    needs_tool("zsh", "zsh")
    code = f'source "$1"; {ZSH_STUBS}; words=("${{@[2,-1]}}"); CURRENT=${{#words}}; _clusterctl'
    out = subprocess.run(["zsh", "-f", "-c", code, "_", str(scripts["zsh"]),
                          *line.split(" ")],
                         capture_output=True, text=True, check=True, env=env(scripts)).stdout
    return {entry.split(":")[0] for entry in out.splitlines()}


def starting(prefix: str, found: set[str]) -> set[str]:
    return {word for word in found if word.startswith(prefix)}


CASES = [
    ("clusterctl sta", {"status", "start"}),
    ("clusterctl jobs l", {"launch", "logs"}),
    ("clusterctl --socket /s jobs c", {"cancel"}),  # an option's value is no verb
    ("clusterctl autostop dev --wait-for j", {"jobs", "jobs_and_ssh"}),
    ("clusterctl status --so", {"--socket"}),  # clusterctl's own options, after the verb
    ("clusterctl jobs queue --a", {"--all"}),
    ("clusterctl completion ", {"bash", "zsh", "fish"}),
    ("clusterctl ssh d", {"dev", "demo"}),  # cluster names, from clusterd
    ("clusterctl down dev t", {"train"}),  # any number of clusters
    ("clusterctl launch -c t", {"train"}),
    ("clusterctl logs dev ", set()),  # a job id: nothing to offer
    ("clusterctl exec dev -- --s", set()),  # after --: the command's, not an option
]


@pytest.mark.parametrize(("line", "expected"), CASES)
def test_bash_completes(scripts: dict[str, Path], line: str, expected: set[str]) -> None:
    assert bash(scripts, line) == expected


@pytest.mark.parametrize(("line", "expected"), CASES)
def test_fish_completes(scripts: dict[str, Path], line: str, expected: set[str]) -> None:
    assert fish(scripts, line) == expected


@pytest.mark.parametrize(("line", "expected"), CASES)
def test_zsh_completes(scripts: dict[str, Path], line: str, expected: set[str]) -> None:
    prefix = line.split(" ")[-1]
    assert starting(prefix, zsh(scripts, line)) - {"@FILES"} == expected


def test_bash_splits_an_option_and_its_value_at_the_equals_sign(scripts: dict[str, Path]
                                                                ) -> None:
    assert bash(scripts, "clusterctl --socket = /s sta") == {"status", "start"}
    assert bash(scripts, "clusterctl autostop dev --wait-for = n") == {"none"}


def test_a_task_file_is_a_file(scripts: dict[str, Path]) -> None:
    (scripts["bash"].parent / "task.yaml").write_text("run: true\n")
    assert bash(scripts, "clusterctl launch -c dev ta") == {"task.yaml"}
    assert fish(scripts, "clusterctl launch -c dev ta") == {"task.yaml"}
    assert zsh(scripts, "clusterctl launch -c dev ta") == {"@FILES"}


@pytest.mark.parametrize("shell", ["zsh", "fish"])
def test_scripts_parse(scripts: dict[str, Path], shell: str) -> None:
    needs_tool(shell, shell)
    subprocess.run([shell, "-n", str(scripts[shell])], check=True)


def test_the_grammar_is_the_parsers() -> None:
    """Nothing is written per command: every verb is there, and an option, choice or
    action a parser gains is completed with no other change."""
    made = grammar(build_parser())
    assert [name for name, _ in made.subcommands["clusterctl"]] == list(VERBS)
    for path in made.paths:
        assert "--socket" in dict(made.options[path]), path
    assert made.slots["clusterctl logs|1"] == CLUSTERS
    assert made.slots["clusterctl logs|2"] == NOTHING
    assert made.slots["clusterctl launch|+"] == FILES

    toy = argparse.ArgumentParser(prog="clusterctl")
    verbs = toy.add_subparsers(dest="verb")
    new = verbs.add_parser("brand-new", help="a verb nobody wrote completion for")
    new.add_argument("--colour", choices=["red", "green"])
    new.add_argument("clusters", nargs="*")
    toy_grammar = grammar(toy)
    assert toy_grammar.subcommands["clusterctl"] == [
        ("brand-new", "a verb nobody wrote completion for")]
    assert toy_grammar.slots["clusterctl brand-new|--colour"] == "red green"
    assert toy_grammar.slots["clusterctl brand-new|+"] == CLUSTERS


def test_completion_needs_a_shell(capsys: pytest.CaptureFixture[str]) -> None:
    run = subprocess.run([sys.executable, "-m", "clusterctl.cli", "completion"],
                         capture_output=True, text=True)
    assert run.returncode == 2
    assert "one of the arguments shell --cluster-names is required" in run.stderr
