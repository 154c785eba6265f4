"""Records hold placements and resource requests as types (`Placement`, `ResourceRequest`),
never as JSON maps: the JSON is made and read in state/'s row mapping only
(state/resources.py), in the shape clusterd has always written, so a database moves between
this clusterd and an older one either way."""

from __future__ import annotations

import ast
import json
import sqlite3
import typing
from pathlib import Path

import pytest

from clusterctl.protocol import ClusterStatus, ManagedJobStatus
from clusterd.locks import ClusterLocks
from clusterd.managed.store import ManagedJobRecord, ManagedJobStore, SubmittedTask
from clusterd.providers.base import Placement
from clusterd.services.status_views import StatusViews
from clusterd.state import ClusterRecord, ClusterStore, Database
from clusterd.state.handles import ClusterHandle
from clusterd.state.resources import load_placement
from clusterd.tasks.loader import load_task
from clusterd.tasks.spec import Infra, ResourceRequest, Resources
from tests.import_graph import ROOT

pytestmark = pytest.mark.anyio

PACKAGE = ROOT / "daemon" / "clusterd"
# Where records are mapped to rows: the only modules that may hold these as JSON maps.
ROW_MAPPING = ("state/", "managed/store.py")
# The names that turn stored JSON into placements and requests.
DECODERS = {"load_placement", "placement_from_text", "request_from_text", "from_view"}
# Modules that may name a decoder: the row mapping, and the types' own module.
DECODING = (*ROW_MAPPING, "tasks/spec.py")

# As clusterd wrote them before records held types (main at 1ccfaab): the exact text.
AWS_PLACED = ('{"accelerator":null,"accelerator_count":0.0,"cpus":2.0,'
              '"instance_type":"c6i.large","memory_gb":4.0,"price_per_hour":0.0248,'
              '"provider":"aws","region":"us-east-1","spot":true,"zone":"us-east-1f"}')
AWS_PLACEMENT = Placement("aws", "us-east-1", "us-east-1f", "c6i.large", 2.0, 4.0, None, 0.0,
                          0.0248, True)
ANY_OF_TASK = ("resources:\n  any_of:\n    - infra: aws/us-east-1\n      cpus: 2+\n"
               "    - infra: aws/us-west-2\n      use_spot: true\n  ports: [8080]\nrun: x\n")
_RESOURCES = ('"disk_size_gb":null,"disk_tier":null,"image_id":null,"infra":"{infra}",'
              '"instance_type":null,"labels":[],"max_hourly_cost":null,'
              '"memory_at_least":false,"memory_gb":null,"pod_config":"","ports":["8080"],'
              '"region_images":[],"use_spot":{spot}')
ANY_OF_REQUESTED = (
    '{"accelerator":null,"accelerator_count":0,"choices":[{"accelerator":null,'
    '"accelerator_count":0,"cpus":2.0,"cpus_at_least":true,'
    + _RESOURCES.replace("{infra}", "aws/us-east-1").replace("{spot}", "false")
    + '},{"accelerator":null,"accelerator_count":0,"cpus":null,"cpus_at_least":false,'
    + _RESOURCES.replace("{infra}", "aws/us-west-2").replace("{spot}", "true")
    + '}],"choices_ordered":false,"cpus":null,"cpus_at_least":false,'
    + _RESOURCES.replace("{infra}", "*").replace("{spot}", "false") + "}")
# A managed job's placement kept five keys; with its cluster gone, every one empty.
JOB_PLACED = ('{"instance_type":"c6i.large","provider":"aws","region":"us-east-1",'
              '"spot":true,"zone":"us-east-1f"}')
JOB_PLACED_NOWHERE = ('{"instance_type":null,"provider":null,"region":null,"spot":null,'
                      '"zone":null}')


def _sources(*under: str) -> list[tuple[str, ast.Module]]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE).as_posix()
        if relative.startswith("agent/v1/"):
            continue
        if not under or relative.startswith(under):
            found.append((relative, ast.parse(path.read_text(), relative)))
    return found


def test_no_placement_or_resources_is_annotated_as_a_json_map_in_the_row_mapping() -> None:
    """`dict[str, Any]` for what is a placement or resources (by its name) is the JSON
    leaking out of the codec: the record would hand callers a map to `.get()` from."""
    leaks = []
    for module, tree in _sources(*ROW_MAPPING):
        for node in ast.walk(tree):
            if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
                name, annotation = node.target.id, node.annotation
            elif isinstance(node, ast.arg) and node.annotation is not None:
                name, annotation = node.arg, node.annotation
            else:
                continue
            if (any(word in name for word in ("resources", "placed", "placement", "intent"))
                    and "dict[" in ast.unparse(annotation)):
                leaks.append(f"{module}:{node.lineno} {name}: {ast.unparse(annotation)}")
    assert leaks == []


def test_the_records_fields_are_typed() -> None:
    clusters = typing.get_type_hints(ClusterRecord)
    assert clusters["requested_resources"] is ResourceRequest
    assert clusters["launched_resources"] == Placement | None
    assert typing.get_type_hints(ManagedJobRecord)["placed"] == Placement | None
    assert typing.get_type_hints(ClusterHandle)["intent"] == Placement | None


def test_only_the_row_mapping_reads_placements_and_requests_from_json() -> None:
    readers = sorted(
        f"{module}:{node.lineno} {ast.unparse(node)}"
        for module, tree in _sources() if not module.startswith(DECODING)
        for node in ast.walk(tree)
        if (isinstance(node, ast.Name) and node.id in DECODERS)
        or (isinstance(node, ast.Attribute) and node.attr in DECODERS))
    assert _sources("state/"), "the sources were not read"
    assert readers == []


def _insert_cluster(path: Path, requested: str, placed: str | None) -> None:
    with sqlite3.connect(path) as conn:
        conn.execute(
            "INSERT INTO clusters (name, provider, cloud_name, status, num_nodes,"
            " requested_resources, launched_resources, config_hash, created_at,"
            " status_updated_at) VALUES ('dev', 'aws', 'dev-1', 'UP', 1, ?, ?, 'h', 0, 0)",
            (requested, placed))


async def test_a_cluster_row_of_an_older_clusterd_reads_typed_and_is_written_back_as_was(
        db: Database) -> None:
    _insert_cluster(db.path, ANY_OF_REQUESTED, AWS_PLACED)
    store = ClusterStore(db)
    await store.load()
    record = store.get("dev")
    assert record is not None
    task = load_task(yaml_text=ANY_OF_TASK)
    assert record.requested_resources == task.request()
    assert record.requested_resources.options() == task.resource_options()
    assert record.launched_resources == AWS_PLACEMENT
    row = record.to_row()
    assert (row["requested_resources"], row["launched_resources"]) == (ANY_OF_REQUESTED,
                                                                        AWS_PLACED)


async def test_a_new_cluster_row_is_what_an_older_clusterd_wrote(db: Database) -> None:
    store = ClusterStore(db)
    await store.load()
    task = load_task(yaml_text=ANY_OF_TASK)
    await store.insert(ClusterRecord("dev", "aws", "dev-1", ClusterStatus.INIT, 1,
                                     task.request(), "h", 0, 0), "created", None)
    await store.set_status("dev", ClusterStatus.UP, "up", launched_resources=AWS_PLACEMENT)
    with sqlite3.connect(db.path) as conn:
        stored = conn.execute("SELECT requested_resources, launched_resources FROM clusters"
                              ).fetchone()
    assert stored == (ANY_OF_REQUESTED, AWS_PLACED)


async def test_a_row_without_resources_reads_as_nothing_asked_and_nowhere_placed(
        db: Database) -> None:
    _insert_cluster(db.path, "{}", None)
    store = ClusterStore(db)
    await store.load()
    record = store.get("dev")
    assert record is not None
    assert record.requested_resources == ResourceRequest(Resources(Infra()))
    assert record.requested_resources.options() == (Resources(),)
    assert record.launched_resources is None


def test_a_placement_an_older_clusterd_kept_in_part_reads_with_its_sizes_unknown() -> None:
    assert load_placement(json.loads(JOB_PLACED)) == Placement(
        "aws", "us-east-1", "us-east-1f", "c6i.large", 0.0, 0.0, spot=True)
    assert load_placement(json.loads(JOB_PLACED_NOWHERE)) is None
    assert load_placement({"cpus": 4}) is None  # no provider: no placement
    assert load_placement(None) is None
    # Keys a newer clusterd may add are ignored.
    assert load_placement({**json.loads(AWS_PLACED), "rack": "r7"}) == AWS_PLACEMENT


async def test_a_managed_jobs_placement_reads_from_either_shape(db: Database) -> None:
    store = ManagedJobStore(db)
    first = await store.insert("a", SubmittedTask(command="x"), "t")
    second = await store.insert("b", SubmittedTask(command="x"), "t")
    with sqlite3.connect(db.path) as conn:
        conn.executemany("UPDATE managed_jobs SET placed = ? WHERE id = ?",
                         [(JOB_PLACED, first.id), (JOB_PLACED_NOWHERE, second.id)])
    await store.load()
    old = store.get(first.id)
    assert old is not None and old.placed is not None
    assert (old.placed.infra, old.placed.instance_type, old.placed.spot) == (
        "aws/us-east-1/us-east-1f", "c6i.large", True)
    assert store.get(second.id).placed is None  # type: ignore[union-attr]

    # Written now, the whole placement: a superset of what an older clusterd reads from it.
    await store.set_status(first.id, ManagedJobStatus.STARTING, "launching",
                           placed=AWS_PLACEMENT)
    with sqlite3.connect(db.path) as conn:
        text = conn.execute("SELECT placed FROM managed_jobs WHERE id = ?",
                            (first.id,)).fetchone()[0]
    assert text == AWS_PLACED
    assert json.loads(text).items() >= json.loads(JOB_PLACED).items()


async def test_status_shows_a_typed_record_as_it_showed_the_stored_maps(db: Database) -> None:
    """The fields `status --json` draws from the placement and the request, for a row in
    the old shape: what it showed when records held the maps themselves."""
    _insert_cluster(db.path, ANY_OF_REQUESTED, AWS_PLACED)
    store = ClusterStore(db)
    await store.load()
    record = store.get("dev")
    assert record is not None
    record = await store.update("dev", num_nodes=2)
    views = StatusViews(store, ClusterLocks(10, 5), {})
    # As a client receives it: msgpack (and the dashboard's JSON) send a tuple as a list.
    shown = json.loads(json.dumps(views.view(record)))
    assert {k: shown[k] for k in ("infra", "cpus", "memory_gb", "instance_type", "region",
                                  "zone", "spot", "price_per_hour", "resources")} == {
        "infra": "aws/us-east-1/us-east-1f", "cpus": 2.0, "memory_gb": 4.0,
        "instance_type": "c6i.large", "region": "us-east-1", "zone": "us-east-1f",
        "spot": True, "price_per_hour": 0.0496, "resources": json.loads(ANY_OF_REQUESTED)}

    unplaced = await store.update("dev", launched_resources=None)
    shown = views.view(unplaced)
    assert {k: shown[k] for k in ("infra", "cpus", "region", "spot", "price_per_hour")} == {
        "infra": "aws", "cpus": None, "region": None, "spot": False, "price_per_hour": None}
    asked = await store.update("dev", requested_resources=ResourceRequest(
        Resources(Infra("aws", None, "us-east-1b"))))
    assert views.view(asked)["infra"] == "aws/*/us-east-1b"
