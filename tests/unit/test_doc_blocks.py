"""Every command block of README.md and docs/*.md is valid bash whose clusterctl and clusterd
commands their own parsers accept (tests/doc_blocks.py has the convention); the README keeps
its shape (the two set-up commands first, under ~200 lines, every docs/ page linked); and every
relative link and repository path the documents name exists."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from tests.doc_blocks import (
    REPO,
    Block,
    DocBlockError,
    blocks,
    documents,
    invocations,
    parse_error,
    repo_paths,
    syntax_error,
)

ALL_BLOCKS = [block for path in documents() for block in blocks(path)]


def test_the_documents_have_command_blocks_to_check() -> None:
    assert len(ALL_BLOCKS) >= 15, [b.where for b in ALL_BLOCKS]
    commands = [c for b in ALL_BLOCKS for c in invocations(b.script)]
    assert len(commands) >= 50


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_block_is_valid_bash(block: Block) -> None:
    assert syntax_error(block) is None, f"{block.where}: {syntax_error(block)}"


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_block_commands_parse(block: Block) -> None:
    refused = [(program, argv, error) for program, argv in invocations(block.script)
               if (error := parse_error(program, argv)) is not None]
    assert not refused, f"{block.where}: {refused}"


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=lambda b: b.where)
def test_block_names_files_that_exist(block: Block) -> None:
    missing = [p for p in repo_paths(block.script) if not (REPO / p).exists()]
    assert not missing, f"{block.where}: {missing}"


def test_readme_starts_with_the_two_set_up_commands() -> None:
    first = blocks(REPO / "README.md")[0]
    commands = [line.split("#")[0].strip() for line in first.script.splitlines()]
    assert commands == ["scripts/quickstart", "scripts/test"]
    text = (REPO / "README.md").read_text()
    assert text.index(first.script.splitlines()[0]) < text.index("## Using it")


def test_readme_is_short_and_links_every_docs_page() -> None:
    text = (REPO / "README.md").read_text()
    assert len(text.splitlines()) <= 200
    pages = {p.name for p in (REPO / "docs").glob("*.md")}
    linked = set(re.findall(r"\]\(docs/([\w.-]+\.md)\)", text))
    assert pages <= linked, f"not linked from README.md: {sorted(pages - linked)}"


def test_readme_using_it_runs_in_the_test() -> None:
    """The blocks after "Using it" are run, not skipped (they are what a newcomer types)."""
    using = [b for b in blocks(REPO / "README.md")[1:]]
    assert using and all(b.skip_reason is None for b in using), [b.where for b in using]


@pytest.mark.parametrize("path", documents(), ids=lambda p: p.name)
def test_relative_links_lead_somewhere(path: Path) -> None:
    # Links in prose only: code (fenced, or `inline`) may hold anything that looks like one.
    text = re.sub(r"```.*?```|`[^`\n]*`", "", path.read_text(), flags=re.S)
    targets = re.findall(r"\]\((?!https?://|#)([^)\s#]+)(?:#[^)]*)?\)", text)
    missing = [t for t in targets if not (path.parent / t).exists()]
    assert not missing, f"{path.name}: {missing}"


# The checks themselves: each must be able to fail.

def write(tmp_path: Path, text: str) -> Path:
    page = tmp_path / "page.md"
    page.write_text(text)
    return page


def test_a_renamed_flag_is_refused(tmp_path: Path) -> None:
    page = write(tmp_path, "```bash\nclusterctl status --refreshed   # no such flag\n```\n")
    [(program, argv)] = invocations(blocks(page)[0].script)
    assert program == "clusterctl"
    assert "unrecognized arguments: --refreshed" in (parse_error(program, argv) or "")
    assert parse_error("clusterd", ["--no-such-flag"]) is not None
    assert parse_error("clusterctl", ["logs", "dev", "3", "--tail", "20"]) is None


def test_programs_are_found_where_commands_start() -> None:
    script = ("K=v clusterctl exec dev -- echo a && clusterctl queue dev | head\n"
              "journalctl --user -u clusterd -f\n"
              "scripts/testbed ec2 exec -- clusterctl launch -c duo -- \\\n  'echo $X'\n"
              "ln -sf \"$PWD/.venv/bin/clusterd\" ~/.local/bin/clusterd  # clusterctl here\n")
    assert invocations(script) == [
        ("clusterctl", ["exec", "dev", "--", "echo", "a"]),
        ("clusterctl", ["queue", "dev"]),
        ("clusterctl", ["launch", "-c", "duo", "--", "echo $X"]),
    ]


def test_markers(tmp_path: Path) -> None:
    page = write(tmp_path, "<!-- doc-test: exit 102 -->\n```bash\nclusterctl queue x\n```\n\n"
                           "<!-- doc-test: skip needs AWS -->\n```sh\nclusterctl check\n```\n\n"
                           "```console\n$ clusterctl status\nNAME  STATUS\n```\n")
    found = blocks(page)
    assert [(b.expected_exit, b.skip_reason, b.script) for b in found] == [
        (102, None, "clusterctl queue x\n"),
        (0, "needs AWS", "clusterctl check\n"),
        (0, None, "clusterctl status\n"),
    ]


@pytest.mark.parametrize("marker", ["<!-- doc-test: skip -->", "<!-- doc-test: exit two -->",
                                    "<!-- doc-test: skipp reason -->"])
def test_a_broken_marker_is_an_error(tmp_path: Path, marker: str) -> None:
    page = write(tmp_path, f"{marker}\n```bash\nclusterctl status\n```\n")
    with pytest.raises(DocBlockError):
        blocks(page)


def test_bash_syntax_errors_are_found(tmp_path: Path) -> None:
    page = write(tmp_path, "```bash\nif clusterctl status; then\n```\n")
    assert syntax_error(blocks(page)[0]) is not None
