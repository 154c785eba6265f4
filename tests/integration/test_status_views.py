"""`status` answers from views cached per cluster record; a refresh stamps every record, and
the views must show the new stamp (and only it) without being built again from scratch.
Against a real daemon whose clusters belong to the in-memory load-test provider."""

from __future__ import annotations

import json
import shutil
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import msgpack
import pytest

import clusterctl
from clusterctl import Client, StatusArgs, protocol
from tests.support import Daemon, make_env, short_tempdir

CLUSTERS = 30


@pytest.fixture(scope="module")
def daemon() -> Iterator[Daemon]:
    root = short_tempdir("cdv-")
    d = Daemon(root, make_env(root)).start()
    try:
        d.stop()  # made its database; the records go in while it is down
        now = time.time()
        db = sqlite3.connect(d.state_dir / "state.db")
        try:
            with db:
                db.executemany(
                    "INSERT INTO clusters (name, provider, cloud_name, status, status_reason,"
                    " num_nodes, requested_resources, launched_resources, handle,"
                    " config_hash, created_at, launched_at, status_updated_at, ever_up)"
                    " VALUES (?, 'loadtest', ?, 'INIT', 'inserted', 1, ?, ?, ?, 'test',"
                    " ?, ?, ?, 1)",
                    [(f"v{i:02d}", f"v{i:02d}-x", json.dumps({"infra": "loadtest/mem"}),
                      json.dumps({"cpus": 4}), json.dumps({"provider": {"nodes": 1}}),
                      now, now, now) for i in range(CLUSTERS)])
        finally:
            db.close()
        d.start({"CLUSTERD_TEST_PROVIDERS": "loadtest"})
        yield d
    finally:  # the load-test provider's nodes are in the daemon's memory: nothing to take down
        if d.process is not None and d.process.poll() is None:
            d.stop()
        shutil.rmtree(root, ignore_errors=True)


def views(daemon: Daemon, verbose: bool, refresh: bool = False) -> dict[str, dict]:
    """The clusters as maps, checked against the same status asked in columns."""
    with Client(daemon.socket, autostart=False) as client:
        maps = client.call(StatusArgs(verbose=verbose, refresh=refresh))["clusters"]
        assert protocol.FEATURE_COLUMNS in client.server_hello["features"]
        table = client.call(StatusArgs(verbose=verbose, columns=True))["clusters"]
    assert set(table) == {"columns", "optional", "rows"} and len(table["rows"]) == len(maps)
    assert protocol.views_of(table) == maps
    return {c["name"]: c for c in maps}


@pytest.mark.parametrize("verbose", [False, True])
def test_a_refresh_shows_its_stamp_in_every_cached_view(daemon: Daemon, verbose: bool) -> None:
    first = views(daemon, verbose, refresh=True)  # settled: all UP, all stamped
    assert len(first) == CLUSTERS and {c["status"] for c in first.values()} == {"UP"}
    assert views(daemon, verbose) == first  # cached: the same again
    time.sleep(0.01)  # the next stamp must differ from this one even on a coarse clock
    second = views(daemon, verbose, refresh=True)
    for name, before in first.items():
        after = second[name]
        assert after["refreshed_at"] > before["refreshed_at"], name
        assert {**after, "refreshed_at": None} == {**before, "refreshed_at": None}, name
    assert views(daemon, verbose) == second


def test_a_change_beside_a_stamp_is_shown(daemon: Daemon) -> None:
    views(daemon, True, refresh=True)
    stopped = daemon.ctl("stop", "-y", "v03")
    assert stopped.returncode == 0, stopped.stderr
    for verbose in (False, True):
        shown = views(daemon, verbose)
        assert shown["v03"]["status"] == "STOPPED"
        assert {c["status"] for n, c in shown.items() if n != "v03"} == {"UP"}
    brief = views(daemon, False, refresh=True)  # stamped after the change: both show
    verbose = views(daemon, True)
    for name, view in brief.items():
        assert view == {key: verbose[name][key] for key in view}, name
    assert brief["v03"]["status"] == "STOPPED"


def test_a_repeated_status_run_loads_no_module_it_does_not_need(
        daemon: Daemon, tmp_path: Path) -> None:
    """What a status run imports is most of its time (`python -X importtime`). A repeated
    command line is recalled without argparse (and the re, gettext and enum it brings); the
    protocol's enums load only when a run meets an error or a status it must name; contextlib,
    functools and socket.py are not used at all: 6-7 ms of a 16 ms run in all."""
    # Without site (-S): the dev venv's editable-install hook imports re and enum at start-up,
    # which an installed clusterctl does not. Its path is given instead.
    path = [str(Path(module.__file__).parents[1]) for module in (clusterctl, msgpack)]
    env = {**daemon.env, "XDG_CACHE_HOME": str(tmp_path), "PYTHONPATH": ":".join(path)}
    command = [sys.executable, "-S", "-X", "importtime", "-c",
               "from clusterctl.cli import main; main()", "status"]
    for _ in range(2):  # the first run parses and keeps the parse
        run = subprocess.run(command, env=env, capture_output=True, text=True, timeout=60)
        assert run.returncode == 0, run.stderr[-2000:]
    assert "v00" in run.stdout and "v29" in run.stdout
    imported = {line.split("|")[-1].strip() for line in run.stderr.splitlines()
                if line.startswith("import time:")}
    assert "clusterctl.client" in imported  # importtime did report the run's imports
    unneeded = {"argparse", "re", "gettext", "enum", "clusterctl._vocabulary", "contextlib",
                "functools", "socket", "selectors", "typing", "dataclasses", "json"}
    assert imported & unneeded == set()
