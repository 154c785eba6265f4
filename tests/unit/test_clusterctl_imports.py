"""clusterctl's modules form layers: no module imports one that imports it back, however
indirectly, lazily or only for type checking (a cycle is a module with two jobs, or a name
with no home)."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "ctl" / "clusterctl"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports_of(path: Path, modules: set[str]) -> set[str]:
    """The clusterctl modules `path` imports, wherever in it (the package `x` for `from x
    import name` unless `x.name` is a module)."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.rsplit(".", node.level - 1)[0] if node.level > 1 else package
                base = f"{anchor}.{base}" if base else anchor
            for alias in node.names:
                found.add(f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules
                          else base)
    return {m for m in found if m in modules and m != name}


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


def test_no_module_of_clusterctl_imports_one_that_imports_it() -> None:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    graph = {module_name(p): imports_of(p, modules) for p in paths}
    assert graph["clusterctl.cli"], "the import graph was not read"
    assert cycles(graph) == []
