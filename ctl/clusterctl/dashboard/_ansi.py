"""Job output with ANSI escape sequences → HTML, chunk by chunk.

A job's log arrives in chunks split anywhere: inside a UTF-8 character, inside an escape
sequence. `AnsiToHtml.feed` keeps what it cannot finish for the next chunk and returns HTML
that stands on its own (every span it opens, it closes), so chunks can be appended to a page
one by one. Colours (SGR: 16, 256 and 24-bit, the last two mapped onto the 256-colour
palette) become classes (the page's Content-Security-Policy forbids inline styles); other
control sequences (cursor moves, erasing, titles) are dropped.
"""

from __future__ import annotations

import codecs
import html
import re

# CSI: ESC [ params intermediates final; OSC: ESC ] ... (BEL | ESC \); a character set
# (ESC ( B and the like); other: ESC + one char.
_SEQUENCE = re.compile(
    r"\x1b(?:\[([0-?]*)[ -/]*([@-~])|\][^\x07\x1b]*(?:\x07|\x1b\\)|[()*+#][ -~]|[@-Z\\-_])"
)
# An escape sequence cut off at the end of a chunk: wait for the rest.
_UNFINISHED = re.compile(r"\x1b(?:\[[0-?]*[ -/]*|\][^\x07\x1b]*|\][^\x07]*\x1b|[()*+#])?$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f]")
# An unfinished sequence longer than this is not one: show it (escaped) rather than wait.
MAX_PENDING = 256

BASIC = ((0, 0, 0), (205, 49, 49), (13, 188, 121), (229, 229, 16), (36, 114, 200),
         (188, 63, 188), (17, 168, 205), (229, 229, 229), (102, 102, 102), (241, 76, 76),
         (35, 209, 139), (245, 245, 67), (59, 142, 234), (214, 112, 214), (41, 184, 219),
         (255, 255, 255))


def palette(index: int) -> tuple[int, int, int]:
    """The xterm 256-colour palette."""
    if index < 16:
        return BASIC[index]
    if index < 232:
        index -= 16
        levels = (0, 95, 135, 175, 215, 255)
        return levels[index // 36], levels[index // 6 % 6], levels[index % 6]
    grey = 8 + (index - 232) * 10
    return grey, grey, grey


def nearest(red: int, green: int, blue: int) -> int:
    """The 256-colour palette entry closest to a 24-bit colour (cube or grey ramp)."""
    def level(value: int) -> int:
        return 0 if value < 48 else 1 if value < 115 else (value - 35) // 40

    r, g, b = level(red), level(green), level(blue)
    cube = 16 + 36 * r + 6 * g + b
    grey_index = min(23, max(0, (red + green + blue) // 3 - 3) // 10)

    def distance(index: int) -> int:
        pr, pg, pb = palette(index)
        return (pr - red) ** 2 + (pg - green) ** 2 + (pb - blue) ** 2

    return min(cube, 232 + grey_index, key=distance)


def stylesheet() -> str:
    """CSS for the classes `AnsiToHtml` emits."""
    rules = [".ab{font-weight:bold}", ".ad{opacity:.7}", ".ai{font-style:italic}",
             ".au{text-decoration:underline}"]
    for index in range(256):
        colour = "#{:02x}{:02x}{:02x}".format(*palette(index))
        rules.append(f".f{index}{{color:{colour}}}")
        rules.append(f".b{index}{{background-color:{colour}}}")
    return "\n".join(rules) + "\n"


class AnsiToHtml:
    def __init__(self) -> None:
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._pending = ""
        self._fg: int | None = None
        self._bg: int | None = None
        self._flags: set[str] = set()
        self._opened = False  # a span is open in the HTML being written
        self.lines = 0  # newlines converted so far

    def feed(self, data: bytes, final: bool = False) -> str:
        text = self._pending + self._decoder.decode(data, final)
        self._pending = ""
        if not final:
            tail = _UNFINISHED.search(text)
            if tail is not None and len(text) - tail.start() <= MAX_PENDING:
                self._pending = text[tail.start():]
                text = text[:tail.start()]
        out: list[str] = []
        self._opened = False
        position = 0
        for match in _SEQUENCE.finditer(text):
            self._text(text[position:match.start()], out)
            position = match.end()
            if match.group(2) == "m":
                self._close(out)
                self._apply(match.group(1))
        self._text(text[position:], out)
        self._close(out)
        return "".join(out)

    def _text(self, text: str, out: list[str]) -> None:
        if not text:
            return
        text = _CONTROL.sub("", text.replace("\r\n", "\n").replace("\r", "\n"))
        if not text:
            return
        if not self._opened:  # spans only around text: no empty ones
            classes = sorted(self._flags)
            if self._fg is not None:
                classes.append(f"f{self._fg}")
            if self._bg is not None:
                classes.append(f"b{self._bg}")
            if classes:
                out.append(f'<span class="{" ".join(classes)}">')
                self._opened = True
        self.lines += text.count("\n")
        out.append(html.escape(text, quote=False))

    def _close(self, out: list[str]) -> None:
        if self._opened:
            out.append("</span>")
            self._opened = False

    def _apply(self, params: str) -> None:
        codes = [int(p) if p.isdigit() else 0 for p in params.replace(":", ";").split(";")]
        i = 0
        while i < len(codes):
            code = codes[i]
            i += 1
            if code == 0:
                self._fg = self._bg = None
                self._flags.clear()
            elif code in _FLAGS:
                self._flags.add(_FLAGS[code])
            elif code in _UNFLAGS:
                self._flags.difference_update(_UNFLAGS[code])
            elif 30 <= code <= 37:
                self._fg = code - 30
            elif 90 <= code <= 97:
                self._fg = code - 90 + 8
            elif 40 <= code <= 47:
                self._bg = code - 40
            elif 100 <= code <= 107:
                self._bg = code - 100 + 8
            elif code == 39:
                self._fg = None
            elif code == 49:
                self._bg = None
            elif code in (38, 48) and i < len(codes):
                colour, i = _extended(codes, i)
                if colour is not None:
                    if code == 38:
                        self._fg = colour
                    else:
                        self._bg = colour


_FLAGS = {1: "ab", 2: "ad", 3: "ai", 4: "au"}
_UNFLAGS = {22: ("ab", "ad"), 23: ("ai",), 24: ("au",)}


def _extended(codes: list[int], i: int) -> tuple[int | None, int]:
    """`5;N` (256 colours) or `2;R;G;B` (24-bit) after a 38 or 48; the colour and where the
    parameters go on."""
    kind = codes[i]
    if kind == 5 and i + 1 < len(codes):
        return max(0, min(255, codes[i + 1])), i + 2
    if kind == 2 and i + 3 < len(codes):
        red, green, blue = (max(0, min(255, c)) for c in codes[i + 1:i + 4])
        return nearest(red, green, blue), i + 4
    return None, len(codes)


def strip(data: bytes) -> str:
    """Plain text: escape sequences removed, for a log saved as text."""
    return _SEQUENCE.sub("", data.decode("utf-8", "replace"))
