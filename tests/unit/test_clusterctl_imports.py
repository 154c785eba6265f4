"""clusterctl's modules form layers: no module imports one that imports it back, however
indirectly, lazily or only for type checking (a cycle is a module with two jobs, or a name
with no home)."""

from __future__ import annotations

from tests.import_graph import ROOT, cycles, import_graph

PACKAGE = ROOT / "ctl" / "clusterctl"


def test_no_module_of_clusterctl_imports_one_that_imports_it() -> None:
    graph = import_graph(PACKAGE)
    assert graph["clusterctl.cli"], "the import graph was not read"
    assert cycles(graph) == []
