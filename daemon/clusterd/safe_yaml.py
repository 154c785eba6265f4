"""YAML from files we do not trust to be small or kind: tasks, node pools, the config file.

`safe_load` bounds what a document may cost once its aliases are expanded (a few hundred
bytes of `&a [*b, *b, ...]` are gigabytes when something walks or prints them), refuses
recursive aliases and deep nesting, and says where the problem is. `read_regular_file` reads a
file without ever blocking: a FIFO or a device given as a task path is refused, not waited on.
Both are blocking work for a thread (`anyio.to_thread`), never for the event loop.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import yaml

# A node counts 1, a scalar also 1 per 64 characters, all counted as if aliases were copies.
MAX_EXPANDED_NODES = 1_000_000
MAX_DEPTH = 64

_Loader: type[yaml.SafeLoader] = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


class YAMLProblem(ValueError):
    """The document is not acceptable YAML; the message says where and why."""


def _where(mark: Any) -> str:
    return f"line {mark.line + 1}, column {mark.column + 1}: " if mark is not None else ""


def _expanded_cost(root: yaml.Node) -> int:
    """The document's size with every alias expanded, computed once per node (aliases share
    node objects); raises YAMLProblem past the limits or on a recursive alias."""
    cost: dict[int, int] = {}
    # Iterative depth-first walk: (node, depth, children done?).
    stack: list[tuple[yaml.Node, int, bool]] = [(root, 1, False)]
    open_nodes: set[int] = set()
    while stack:
        node, depth, done = stack.pop()
        key = id(node)
        if done:
            open_nodes.discard(key)
            total = 1
            for child in _children(node):
                total += cost[id(child)]
                if total > MAX_EXPANDED_NODES:
                    raise YAMLProblem(f"{_where(node.start_mark)}the document expands to "
                                      f"more than {MAX_EXPANDED_NODES:,} values (aliases "
                                      "count once per use)")
            cost[key] = total
            continue
        if key in cost:
            continue
        if key in open_nodes:
            raise YAMLProblem(f"{_where(node.start_mark)}an alias refers to a node that "
                              "contains it (a recursive alias)")
        if depth > MAX_DEPTH:
            raise YAMLProblem(f"{_where(node.start_mark)}nested more than {MAX_DEPTH} levels "
                              "deep")
        if isinstance(node, yaml.ScalarNode):
            cost[key] = 1 + len(node.value) // 64
            continue
        open_nodes.add(key)
        stack.append((node, depth, True))
        stack.extend((child, depth + 1, False) for child in _children(node)
                     if id(child) not in cost)
    return cost[id(root)]


def _children(node: yaml.Node) -> list[yaml.Node]:
    if isinstance(node, yaml.MappingNode):
        return [part for pair in node.value for part in pair]
    if isinstance(node, yaml.SequenceNode):
        return list(node.value)
    return []


def safe_load(text: str) -> Any:
    """Like yaml.safe_load, within the bounds above. Raises YAMLProblem."""
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_cost(node)
        return loader.construct_document(node)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        problem = getattr(exc, "problem", None) or str(exc)
        raise YAMLProblem(f"{_where(mark)}{problem}") from None
    except RecursionError:
        raise YAMLProblem(f"nested more than {MAX_DEPTH} levels deep") from None
    except (ValueError, OverflowError) as exc:  # PyYAML lets these out on hostile escapes
        raise YAMLProblem(f"not valid YAML: {exc}") from None
    finally:
        loader.dispose()


def count_documents(text: str) -> int:
    """How many YAML documents `text` holds (from the parser's events: nothing is built);
    0 if it is not YAML at all."""
    count = 0
    try:
        for event in yaml.parse(text, Loader=yaml.SafeLoader):
            if isinstance(event, yaml.DocumentStartEvent):
                count += 1
    except (yaml.YAMLError, ValueError, OverflowError, RecursionError):
        # PyYAML's scanner lets a few of these out on hostile escapes ("\U7fffffff").
        return count
    return count


def read_regular_file(path: str, max_bytes: int) -> bytes:
    """The bytes of a regular file of at most `max_bytes`. Never blocks on a FIFO, socket or
    device: those are refused (OSError with a message). FileNotFoundError,
    IsADirectoryError and other OSErrors pass through."""
    info = os.stat(path)
    if stat.S_ISDIR(info.st_mode):
        raise IsADirectoryError(path)
    if not stat.S_ISREG(info.st_mode):
        raise OSError(f"{path} is not a regular file (a FIFO, socket or device)")
    # O_NONBLOCK: should it have become a FIFO since the stat, open does not wait for a
    # writer, and the fstat below refuses it.
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY)
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise OSError(f"{path} is not a regular file (a FIFO, socket or device)")
        chunks: list[bytes] = []
        size = 0
        while chunk := os.read(fd, min(1 << 20, max_bytes + 1 - size)):
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise OSError(f"{path} is larger than {max_bytes} bytes")
        return b"".join(chunks)
    finally:
        os.close(fd)
