"""Job output with ANSI colours becomes HTML, whatever the chunk boundaries."""

from __future__ import annotations

import re

import pytest

from clusterctl.dashboard._ansi import AnsiToHtml, nearest, palette, strip, stylesheet


def styled(html_text: str) -> list[tuple[str, str]]:
    """Each character with its classes: what a reader sees, however spans are cut."""
    out, classes = [], ""
    for tag, cls, text in re.findall(r'(<span class="([^"]*)">|</span>)|([^<]+)', html_text):
        if tag:
            classes = cls
        else:
            out += [(c, classes) for c in text]
    return out


def convert(*chunks: bytes) -> str:
    converter = AnsiToHtml()
    return "".join(converter.feed(c) for c in chunks) + converter.feed(b"", final=True)


def test_plain_text_is_escaped() -> None:
    assert convert(b"<script>alert(1)</script> & \"q\"\n") == (
        "&lt;script&gt;alert(1)&lt;/script&gt; &amp; \"q\"\n")


def test_colours_and_resets() -> None:
    assert convert(b"a\x1b[31mred\x1b[0mb") == 'a<span class="f1">red</span>b'
    assert convert(b"\x1b[1;92;44mx\x1b[22my\x1b[39;49mz") == (
        '<span class="ab f10 b4">x</span><span class="f10 b4">y</span>z')
    assert convert(b"\x1b[38;5;208mo\x1b[48;5;17m") == '<span class="f208">o</span>'
    assert convert(b"\x1b[38;2;255;0;0mr") == f'<span class="f{nearest(255, 0, 0)}">r</span>'
    assert convert(b"\x1b[mreset") == "reset"  # no parameter means 0


def test_every_chunk_stands_on_its_own() -> None:
    converter = AnsiToHtml()
    first = converter.feed(b"\x1b[32mgreen ")
    second = converter.feed(b"still green\x1b[0m plain")
    assert first == '<span class="f2">green </span>'
    assert second == '<span class="f2">still green</span> plain'


@pytest.mark.parametrize("cut", range(1, 14))
def test_sequences_and_characters_split_anywhere(cut: int) -> None:
    data = "\x1b[1;31mé€\x1b]0;title\x07ok\n".encode()
    whole = convert(data)
    assert styled(convert(data[:cut], data[cut:])) == styled(whole)
    assert whole == '<span class="ab f1">é€ok\n</span>'


def test_other_control_sequences_are_dropped() -> None:
    assert convert(b"a\x1b[2Kb\x1b[1Ac\x1b(Bd\x07e\x08f") == "abcdef"
    assert convert(b"50%\r100%\r\ndone\n") == "50%\n100%\ndone\n"


def test_a_lone_escape_at_the_end_waits_then_shows() -> None:
    converter = AnsiToHtml()
    assert converter.feed(b"x\x1b") == "x"
    assert converter.feed(b"[0mY") == "Y"
    assert converter.feed(b"\x1b[", final=True) == "["  # the end: what it was, shown


def test_a_runaway_sequence_is_not_held_forever() -> None:
    converter = AnsiToHtml()
    out = converter.feed(b"\x1b]" + b"x" * 1000)
    assert "x" * 900 in out  # shown, not buffered without bound


def test_lines_are_counted() -> None:
    converter = AnsiToHtml()
    converter.feed(b"a\nb\x1b[31m\nc")
    converter.feed(b"\r\n")
    assert converter.lines == 3


def test_palette_and_stylesheet() -> None:
    assert palette(1) == (205, 49, 49) and palette(16) == (0, 0, 0)
    assert palette(231) == (255, 255, 255) and palette(232) == (8, 8, 8)
    assert nearest(0, 0, 0) == 16 and nearest(255, 255, 255) == 231
    css = stylesheet()
    assert len(re.findall(r"^\.f\d+\{", css, re.M)) == 256
    assert ".b255{background-color:#eeeeee}" in css


def test_strip_for_text() -> None:
    assert strip(b"\x1b[31mred\x1b[0m \xff") == "red \ufffd"
