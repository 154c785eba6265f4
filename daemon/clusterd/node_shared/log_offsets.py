"""Where the last lines of a log file begin: the agent tails job logs from there, and the daemon
its managed jobs' logs, so both read `--tail N` the same way."""

from __future__ import annotations

from pathlib import Path

CHUNK_BYTES = 1024 * 1024


# Lines still to find above which a chunk's newlines are counted at once (a C loop over the
# chunk) rather than found one by one (a Python step each).
_COUNT_FROM = 256


def tail_offset(path: Path, lines: int) -> int:
    """Byte offset where the last `lines` lines of the file begin (0 for `lines` <= 0: all).

    Reads backwards one chunk at a time, so memory stays at a chunk whatever the file's
    size. Newlines are found by C loops, not a Python loop per byte: `rfind` (memrchr) one
    by one near the end, `count` for whole chunks while many lines are still to go, and a
    chunk without any is skipped at memchr speed."""
    try:
        size = path.stat().st_size
    except FileNotFoundError:
        return 0
    if lines <= 0 or size == 0:
        return 0
    with open(path, "rb", buffering=0) as f:  # whole chunks: a buffer would only copy
        position = size
        # A trailing newline ends the last line; it does not start another.
        f.seek(size - 1)
        needed = lines + (1 if f.read(1) == b"\n" else 0)
        while position > 0:
            step = min(CHUNK_BYTES, position)
            position -= step
            f.seek(position)
            block = f.read(step)
            if needed > _COUNT_FROM and b"\n" in block:
                found = block.count(b"\n")
                if found < needed:
                    needed -= found
                    continue
            end = len(block)
            while (end := block.rfind(b"\n", 0, end)) >= 0:
                needed -= 1
                if needed == 0:
                    return position + end + 1
    return 0
