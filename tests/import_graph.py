"""The import graph of a package, read from its source (every import, wherever it is: at the
top, inside a function, or only for type checking), for the tests that keep it layered."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def module_name(path: Path, package: Path) -> str:
    parts = path.relative_to(package.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str], package: Path) -> set[str]:
    """The package's modules `path` imports, wherever in it (the package `x` for `from x
    import name` unless `x.name` is a module)."""
    name = module_name(path, package)
    parent = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = parent.rsplit(".", node.level - 1)[0] if node.level > 1 else parent
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                          else base)
    return {m for m in found if m in modules and m != name}


def import_graph(package: Path, skip: tuple[str, ...] = ()) -> dict[str, set[str]]:
    """Module -> the modules of the same package it imports (modules under `skip`, such as
    generated code, left out)."""
    paths = sorted(p for p in package.rglob("*.py")
                   if not any(str(p.relative_to(package)).startswith(s) for s in skip))
    modules = {module_name(p, package) for p in paths}
    return {module_name(p, package): imports_of(p, modules, package) for p in paths}


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Each cycle once, as the path that closes it."""
    found: list[list[str]] = []
    done: set[str] = set()

    def visit(node: str, path: list[str]) -> None:
        for after in sorted(graph[node]):
            if after in path:
                found.append([*path[path.index(after):], after])
            elif after not in done:
                visit(after, [*path, after])
        done.add(node)

    for start in sorted(graph):
        if start not in done:
            visit(start, [start])
    return found
