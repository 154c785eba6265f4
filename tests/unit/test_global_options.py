"""clusterctl's own options (--socket, --no-autostart, --version) are accepted after the verb
too, at every level (`jobs queue --socket S`), as people type them; given before the verb,
a verb's parser does not undo them."""

from __future__ import annotations

import pytest

from clusterctl._parser import VERBS
from clusterctl.cli import parse


@pytest.mark.parametrize("words", [
    ["--socket", "/s", "--no-autostart", "status"],
    ["status", "--socket", "/s", "--no-autostart"],
    ["--no-autostart", "status", "--socket", "/s"],
    ["status", "--socket=/s", "--no-autostart", "--json"],
])
def test_before_or_after_the_verb(words: list[str]) -> None:
    args = parse(words)
    assert (args.verb, args.socket, args.no_autostart) == ("status", "/s", True)


def test_not_given_they_keep_their_defaults() -> None:
    args = parse(["queue", "dev"])
    assert (args.socket, args.no_autostart) == (None, False)
    # Before the verb, and not again after it: the verb's parser leaves them be.
    args = parse(["--socket", "/s", "--no-autostart", "queue", "dev", "--json"])
    assert (args.socket, args.no_autostart, args.json) == ("/s", True, True)


def test_after_a_verbs_action_and_among_a_commands_options() -> None:
    args = parse(["jobs", "queue", "--socket", "/s", "--all"])
    assert (args.jobs_action, args.socket, args.all) == ("queue", "/s", True)
    args = parse(["jobs", "--no-autostart", "cancel", "3"])
    assert (args.no_autostart, args.job_ids) == (True, [3])
    args = parse(["exec", "dev", "--socket", "/s", "--", "echo", "--socket", "x"])
    assert args.socket == "/s" and args.entrypoint == ["echo", "--socket", "x"]


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_every_verb_takes_them(verb: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_:
        parse([verb, "--version"])
    assert exit_.value.code == 0
    assert capsys.readouterr().out.startswith("clusterctl ")
    with pytest.raises(SystemExit):
        parse([verb, "--help"])
    assert "--no-autostart" in capsys.readouterr().out
