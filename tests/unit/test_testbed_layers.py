"""The two test beds share their common parts through scripts/_testbed/common (the control
socket, the namespace and the registries of live beds, helpers), never by importing each
other's internals; common imports neither bed."""

from __future__ import annotations

from tests.import_graph import ROOT, import_graph

PACKAGE = ROOT / "scripts" / "_testbed"


def test_neither_bed_imports_the_other_and_common_imports_no_bed() -> None:
    graph = import_graph(PACKAGE)
    assert "_testbed.common.host" in graph and "_testbed.k8s.commands" in graph
    crossing = sorted(
        f"{module} imports {imported}" for module, imports in graph.items()
        for imported in imports
        for mine, theirs in (("_testbed.ec2", "_testbed.k8s"), ("_testbed.k8s", "_testbed.ec2"),
                             ("_testbed.common", "_testbed.ec2"),
                             ("_testbed.common", "_testbed.k8s"))
        if module.startswith(mine) and imported.startswith(theirs))
    assert crossing == []
