"""The command blocks of README.md and docs/*.md, found and checked without running them.

The convention (written for readers in docs/testing.md):
- A command block is a fenced block whose language is `bash`, `sh` or `console`; in a
  `console` block the commands are the lines that start with `$ ` (the rest is output).
- An HTML comment on the line just above a block changes how it is run:
  `<!-- doc-test: exit N -->` (run; must exit N) or `<!-- doc-test: skip REASON -->` (not run,
  for a reason that must be given; still checked). Any other `doc-test:` word is an error, so
  a misspelt marker cannot quietly turn a check off.
- Every block must pass `bash -n`, and every `clusterctl ...` or `clusterd ...` command in it
  must be accepted by that program's own argument parser (so a renamed flag fails).
tests/unit/test_doc_blocks.py checks every block so; tests/e2e/test_docs_commands.py runs the
runnable ones against a real daemon.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import re
import shlex
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
COMMAND_LANGUAGES = frozenset({"bash", "sh", "console"})
MARKER = re.compile(r"^<!--\s*doc-test:\s*(?P<word>\S+)\s*(?P<argument>.*?)\s*-->$")
FENCE = re.compile(r"^(?P<indent>\s*)```(?P<language>[\w+-]*)\s*$")
# Where one simple command ends and the next begins, as shlex's punctuation_chars splits them.
OPERATORS = frozenset({"&&", "||", ";", "|", "&", "(", ")", ";;"})
# Redirections (`> FILE`, `< FILE`): they and their target
# are taken out of the command's arguments.
REDIRECTIONS = frozenset({">", ">>", "<", "<<", ">&", "&>", ">|"})
PROGRAMS = frozenset({"clusterctl", "clusterd"})
ASSIGNMENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*=")


class DocBlockError(ValueError):
    """A document breaks the convention (a marker misspelt, a skip without its reason)."""


@dataclasses.dataclass(frozen=True)
class Block:
    path: Path
    line: int  # the opening fence's line, 1-based
    language: str
    script: str  # the commands, ready for bash
    expected_exit: int = 0
    skip_reason: str | None = None

    @property
    def where(self) -> str:
        return f"{self.path.relative_to(REPO) if self.path.is_relative_to(REPO) else self.path}" \
               f":{self.line}"


def documents(root: Path = REPO) -> list[Path]:
    """README.md and every page of docs/, in a stable order."""
    return [root / "README.md", *sorted((root / "docs").glob("*.md"))]


def blocks(path: Path) -> list[Block]:
    """The command blocks of one Markdown file, in order."""
    lines = path.read_text().splitlines()
    found: list[Block] = []
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        indent, language = opening["indent"], opening["language"]
        end = next((i for i in range(index + 1, len(lines)) if lines[i].strip() == "```"), None)
        if end is None:
            raise DocBlockError(f"{path}:{index + 1}: a code block that is never closed")
        body = [line.removeprefix(indent) for line in lines[index + 1:end]]
        marker = _marker(path, lines, index)
        if language in COMMAND_LANGUAGES:
            found.append(_block(path, index + 1, language, body, marker))
        elif marker is not None:
            raise DocBlockError(f"{path}:{index}: a doc-test marker above a {language or 'plain'}"
                                " block, which is not a command block")
        index = end + 1
    return found


def _marker(path: Path, lines: list[str], fence: int) -> tuple[str, str] | None:
    above = lines[fence - 1].strip() if fence > 0 else ""
    if "doc-test" not in above:
        return None
    match = MARKER.match(above)
    if match is None or match["word"] not in ("exit", "skip"):
        raise DocBlockError(f"{path}:{fence}: not a doc-test marker: {above!r} (use "
                            "<!-- doc-test: exit N --> or <!-- doc-test: skip REASON -->)")
    return match["word"], match["argument"]


def _block(path: Path, line: int, language: str, body: list[str],
           marker: tuple[str, str] | None) -> Block:
    if language == "console":
        body = [text[2:] for text in body if text.startswith("$ ")]
    block = Block(path, line, language, "\n".join(body) + "\n")
    if marker is None:
        return block
    word, argument = marker
    if word == "skip":
        if not argument:
            raise DocBlockError(f"{path}:{line - 1}: doc-test: skip needs a reason")
        return dataclasses.replace(block, skip_reason=argument)
    if not argument.isdigit():
        raise DocBlockError(f"{path}:{line - 1}: doc-test: exit needs a number, not {argument!r}")
    return dataclasses.replace(block, expected_exit=int(argument))


def syntax_error(block: Block) -> str | None:
    """bash's complaint about the block's syntax, or None."""
    result = subprocess.run(["bash", "-n", "-c", block.script], capture_output=True, text=True,
                            timeout=30)
    if result.returncode == 0:
        return None
    return result.stderr.strip() or f"bash -n exited {result.returncode}"


def invocations(script: str) -> list[tuple[str, list[str]]]:
    """Each clusterctl or clusterd command in a script: (program, its arguments). A program
    counts where a command starts (after variable assignments) and after the `--` of a
    wrapper (`scripts/testbed ec2 exec -- clusterctl ...`); elsewhere the word is an argument
    (`journalctl -u clusterd`)."""
    found = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        command: list[str] = []
        redirected = False
        for word in [*lexer, ";"]:
            if redirected:  # a redirection's target is no argument of the command
                redirected = False
                continue
            if word in REDIRECTIONS:
                redirected = True
                continue
            if word not in OPERATORS:
                command.append(word)
                continue
            found.extend(_programs_in(command))
            command = []
    return found


def _programs_in(command: list[str]) -> list[tuple[str, list[str]]]:
    start = 0
    while start < len(command) and ASSIGNMENT.match(command[start]):
        start += 1
    for at in range(start, len(command)):
        program = Path(command[at]).name
        if program in PROGRAMS and (at == start or command[at - 1] == "--"):
            return [(program, command[at + 1:])]
    return []


def parse_error(program: str, argv: list[str]) -> str | None:
    """What the program's own parser says of these arguments, or None if it takes them."""
    if program == "clusterctl":
        from clusterctl._parser import parse as parse_clusterctl

        def parse() -> object:
            return parse_clusterctl(argv)
    else:
        from clusterd.main import parse_args

        def parse() -> object:
            return parse_args(argv)
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said), contextlib.redirect_stdout(io.StringIO()):
            parse()
    except SystemExit as exit_:
        if exit_.code not in (0, None):  # --help and --version exit 0
            return said.getvalue().strip() or f"exit {exit_.code}"
    return None


def repo_paths(script: str) -> list[str]:
    """Words of a script that name a file of this repository (docs/..., scripts/...)."""
    words = []
    for line in script.replace("\\\n", " ").splitlines():
        lexer = shlex.shlex(line, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words += [w for w in lexer if re.match(r"^(docs|scripts|systemd|tests)/", w)]
    return words
