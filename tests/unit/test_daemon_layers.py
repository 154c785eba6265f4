"""The daemon's modules form layers, and every import points down (or sideways, in its layer):
the SSH layer knows nothing of providers, the runtime or services; providers know nothing of
the state, the runtime or the services that use them; and so on up to the app that builds
them all. An arrow pointing up is a name in the wrong home: move it down (as `clusterd.nodes`
and `clusterd.commands` hold what the SSH layer and the providers share)."""

from __future__ import annotations

import ast

from tests.import_graph import ROOT, cycles, import_graph, module_name

PACKAGE = ROOT / "daemon" / "clusterd"
GENERATED = ("agent/v1",)

# Lowest first. A module belongs to the longest name here that it starts with; it may import
# modules of its own layer and of lower ones, nothing above (and no cycle, whatever the layer).
LAYERS: tuple[frozenset[str], ...] = tuple(frozenset(layer) for layer in (
    # Helpers and shared vocabulary (and the agent, shipped to nodes with what it shares with
    # the daemon: a program of its own, see the tests at the end).
    {"clusterd", "clusterd.redact", "clusterd.safe_yaml", "clusterd.sqlite", "clusterd.log",
     "clusterd.faults", "clusterd.concurrency", "clusterd.config", "clusterd.user_config",
     "clusterd.locks", "clusterd.nodes", "clusterd.commands", "clusterd.rsync",
     "clusterd.node_shared", "clusterd.agent",
     # What a budget is (the config file's `budget:`), pure: below the config that reads it.
     "clusterd.cost.budget"},
    # How nodes are reached; what tasks ask for.
    {"clusterd.ssh", "clusterd.tasks"},
    # Where nodes come from.
    {"clusterd.providers"},
    # What the daemon remembers.
    {"clusterd.state"},
    # What clusters cost: prices of placements, the ledger of records' node time.
    {"clusterd.cost"},
    {"clusterd.requests", "clusterd.runtime"},
    # Buckets: their records, S3, and what nodes do with them.
    {"clusterd.storage"},
    {"clusterd.provision"},
    # The controller engine: what every desired-state controller runs on.
    {"clusterd.control"},
    # Managed jobs drive the services (their records are state of their own); kept logs
    # copy jobs' logs beside them (with managed jobs' log files).
    {"clusterd.services", "clusterd.managed", "clusterd.keptlogs"},
    # Budgets act through the services and on managed jobs (their record beside them).
    {"clusterd.cost.budget_controller", "clusterd.cost.budget_actions",
     "clusterd.cost.budget_store",
     # The idle-cost guard: a controller on the engine, over the records and the ledger.
     "clusterd.cost.idle_guard"},
    {"clusterd.server"},
    {"clusterd.app"},
    {"clusterd.main", "clusterd.__main__"},
))
# The agent (`clusterd.agent`) is a separate program that runs on nodes. The daemon reaches it
# through one door, its gRPC client (the only importer of the generated code outside the
# agent); what both need is in clusterd.node_shared. The node helper's commands are run, not
# imported (`python -m clusterd.agent.node`), and their typed requests live in node_shared.
AGENT = "clusterd.agent"
AGENT_DOORS = frozenset({"clusterd.runtime.agent_client"})
# ... and the node helper's one door: it sends typed requests (node_shared/node_commands.py).
NODE_HELPER_DOOR = "clusterd.runtime.node_helper"
# What the node program takes of the daemon's package: what it shares with the daemon, and
# three helpers of no one layer (logging, SQLite, URL redaction). All shipped with it, and
# kept Python 3.10 code (test_node_python.py).
AGENT_MAY_IMPORT = ("clusterd.agent", "clusterd.node_shared", "clusterd.log", "clusterd.sqlite",
                    "clusterd.redact")
RANK = {part: rank for rank, layer in enumerate(LAYERS) for part in layer}


def part_of(module: str) -> str:
    """The name in LAYERS a module belongs to (the longest that is it or a package of it)."""
    candidates = [p for p in RANK if module == p or module.startswith(p + ".")]
    assert candidates, f"{module} is in no layer: add it to LAYERS"
    return max(candidates, key=len)


def test_no_module_of_clusterd_imports_one_that_imports_it() -> None:
    graph = import_graph(PACKAGE, GENERATED)
    assert graph["clusterd.app"], "the import graph was not read"
    assert cycles(graph) == []


def test_every_import_points_down_or_sideways() -> None:
    graph = import_graph(PACKAGE, GENERATED)
    upward = sorted(
        f"{module} ({part_of(module)}) imports {imported} ({part_of(imported)})"
        for module, imports in graph.items() for imported in imports
        if RANK[part_of(imported)] > RANK[part_of(module)])
    assert upward == []


def test_ssh_imports_nothing_of_providers_runtime_or_services() -> None:
    graph = import_graph(PACKAGE, GENERATED)
    above = ("clusterd.providers", "clusterd.runtime", "clusterd.services", "clusterd.state",
             "clusterd.provision", "clusterd.server", "clusterd.app")
    found = sorted(f"{module} imports {imported}" for module, imports in graph.items()
                   if module.startswith("clusterd.ssh") for imported in imports
                   if imported.startswith(above))
    assert graph["clusterd.ssh.runner"], "the import graph was not read"
    assert found == []


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_only_the_agent_client_imports_the_agent() -> None:
    graph = import_graph(PACKAGE)
    found = sorted(f"{module} imports {imported}" for module, imports in graph.items()
                   if not _within(module, AGENT) and module not in AGENT_DOORS
                   for imported in imports if _within(imported, AGENT))
    assert graph["clusterd.runtime.agent_client"], "the import graph was not read"
    assert found == []


def test_only_the_agent_client_and_the_agent_import_the_generated_grpc_code() -> None:
    graph = import_graph(PACKAGE)
    generated = f"{AGENT}.v1.agent_pb2"
    importers = {module for module, imports in graph.items() if generated in imports}
    assert "clusterd.runtime.agent_client" in importers, "the import graph was not read"
    assert sorted(m for m in importers if not _within(m, AGENT)) == sorted(AGENT_DOORS)


def test_services_never_import_the_agent() -> None:
    graph = import_graph(PACKAGE)
    found = sorted(f"{module} imports {imported}" for module, imports in graph.items()
                   if _within(module, "clusterd.services") for imported in imports
                   if _within(imported, AGENT))
    assert graph["clusterd.services.jobs"], "the import graph was not read"
    assert found == []


def test_the_agent_imports_only_what_is_shipped_with_it() -> None:
    graph = import_graph(PACKAGE)
    found = sorted(f"{module} imports {imported}" for module, imports in graph.items()
                   if _within(module, AGENT) for imported in imports
                   if not any(_within(imported, allowed) for allowed in AGENT_MAY_IMPORT))
    assert graph["clusterd.agent.node"], "the import graph was not read"
    assert found == []


def test_only_the_node_helper_client_runs_the_node_helper() -> None:
    """The daemon runs `python -m clusterd.agent.node` in one place, which takes typed
    requests only: no module names that program, or the untyped call beneath (`_call_json`)."""
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = module_name(path, PACKAGE)
        if module == NODE_HELPER_DOOR or _within(module, AGENT):
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            named = (node.id if isinstance(node, ast.Name) else
                     node.attr if isinstance(node, ast.Attribute) else
                     node.name if isinstance(node, ast.alias) else
                     node.value if isinstance(node, ast.Constant) else None)
            if named in ("call_json", "_call_json", f"{AGENT}.node"):
                found.append(f"{module}:{node.lineno}: {named}")  # type: ignore[attr-defined]
    assert (PACKAGE / "runtime" / "node_helper.py").exists(), "the door moved: follow it"
    assert found == []
