"""The code that runs on nodes runs on Python 3.10, the oldest a supported image ships (Ubuntu
22.04's): a node's runtime is built for the node's own Python, not the daemon's.

What runs there is the agent's package and everything it imports (of clusterd and clusterctl).
Three checks keep it so: ruff reads that code as 3.10's (pyproject.toml's per-file target
versions, which must name exactly that closure), mypy checks it against 3.10's standard
library (no `tomllib`, `typing.Self`, `enum.StrEnum`, `asyncio.timeout`...), and a real
Python 3.10 compiles it (no `except*`, no new syntax).
"""

from __future__ import annotations

import glob
import subprocess
import tomllib
from pathlib import Path

from mypy import api as mypy_api

from tests.import_graph import ROOT, imports_of, module_name

PACKAGES = (ROOT / "daemon" / "clusterd", ROOT / "ctl" / "clusterctl")
NODE_ENTRY = "clusterd.agent"  # every module under it may run on a node (`-m` entry points)
GENERATED = "clusterd.agent.v1"  # grpc_tools' output, checked by running it on a 3.10 node
# The machine image's pyenv has it (CI runs on the same kind of machine).
PYTHON310 = "/root/.pyenv/versions/3.10.*/bin/python3.10"


def _modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in package.rglob("*.py"):
            found[module_name(path, package)] = path
    return found


def node_closure() -> dict[str, Path]:
    """Module -> file, for every module a node may import: the agent's package and, through
    its imports (wherever they are), the rest; parent packages too (their __init__ runs)."""
    modules = _modules()
    names = set(modules)
    todo = [m for m in modules if m == NODE_ENTRY or m.startswith(NODE_ENTRY + ".")]
    seen: set[str] = set()
    while todo:
        name = todo.pop()
        if name in seen or name not in modules:
            continue
        seen.add(name)
        parts = name.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)))
        package = next(p for p in PACKAGES if p.name == parts[0])
        todo.extend(imports_of(modules[name], names, package))
    return {m: modules[m] for m in sorted(seen)}


def _checked_files() -> list[Path]:
    return [p for m, p in node_closure().items()
            if not (m == GENERATED or m.startswith(GENERATED + "."))]


def test_ruff_reads_exactly_the_node_code_as_python_310() -> None:
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())
    targets = config["tool"]["ruff"]["per-file-target-version"]
    assert set(targets.values()) == {"py310"}
    # ruff's `dir/**` is every file under dir (pathlib's is directories only).
    covered = {p for pattern in targets
               for p in ROOT.glob(pattern + "/*.py" if pattern.endswith("**") else pattern)
               if p.suffix == ".py"}
    expected = set(node_closure().values())
    assert sorted(map(str, expected - covered)) == [], "node code ruff reads as 3.11's"
    assert sorted(map(str, covered - expected)) == [], "daemon-only code marked as node code"


def test_node_code_type_checks_against_python_310() -> None:
    files = [str(p.relative_to(ROOT)) for p in _checked_files()]
    out, err, status = mypy_api.run(["--python-version", "3.10", "--no-error-summary",
                                     *files])
    assert status == 0, out + err


def test_python_310_compiles_the_node_code() -> None:
    found = sorted(glob.glob(PYTHON310))
    assert found, (f"no Python 3.10 at {PYTHON310} to compile the node code with: this "
                   "machine image should have pyenv's (install one there: pyenv install 3.10)")
    script = ("import sys\n"
              "for path in sys.argv[1:]:\n"
              "    with open(path, encoding='utf-8') as f:\n"
              "        compile(f.read(), path, 'exec', dont_inherit=True)\n")
    done = subprocess.run([found[-1], "-c", script, *map(str, node_closure().values())],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr
