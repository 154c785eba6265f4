"""Task files, pool files and numbers written to hurt: each gets a clear error in bounded time
and memory (the frame decoder's share is in test_fuzz.py and the integration tests)."""

from __future__ import annotations

import os
import resource
import threading
import time
from pathlib import Path

import pytest

from clusterctl.protocol import ErrorCode
from clusterd.providers.ssh_pools import PoolFileError, load_pools
from clusterd.safe_yaml import YAMLProblem, read_regular_file, safe_load
from clusterd.tasks import TaskError, load_task
from clusterd.user_config import ConfigError, parse

BILLION_LAUGHS = "\n".join(
    ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    + [f"{chr(98 + i)}: &{chr(98 + i)} [" + ", ".join([f"*{chr(97 + i)}"] * 9) + "]"
       for i in range(8)]
    + ["run: echo hi", "resources:", "  labels: {bomb: *i}", "  ports: *i"]
)


def task_error(text: str) -> TaskError:
    with pytest.raises(TaskError) as info:
        load_task(yaml_text=text, source="t.yaml")
    assert info.value.code == ErrorCode.INVALID_TASK
    return info.value


def peak_rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def test_an_alias_bomb_is_refused_fast_and_small() -> None:
    assert len(BILLION_LAUGHS) < 600  # 9**9 = 387 million "lol"s once expanded
    before = peak_rss_mb()
    started = time.monotonic()
    error = task_error(BILLION_LAUGHS)
    assert "expands to more than 1,000,000 values" in error.message
    assert time.monotonic() - started < 2
    assert peak_rss_mb() - before < 50


def test_small_aliases_still_work() -> None:
    spec = load_task(yaml_text="envs: {A: &one '1', B: *one}\nrun: echo\n", source="t.yaml")
    assert spec.envs == {"A": "1", "B": "1"}
    assert safe_load("x: &x [1, 2]\ny: *x\n") == {"x": [1, 2], "y": [1, 2]}


def test_recursive_alias_and_deep_nesting_are_refused() -> None:
    with pytest.raises(YAMLProblem, match="recursive alias"):
        safe_load("a: &a [1, *a]\n")
    with pytest.raises(YAMLProblem, match="nested more than 64 levels"):
        safe_load("x: " + "[" * 100 + "]" * 100 + "\n")
    assert "not valid YAML" in task_error("run: x\nenvs: " + "[" * 5000 + "]" * 5000).message


@pytest.mark.parametrize(("text", "field", "words"), [
    ("num_nodes: 1000000", "num_nodes", "from 1 to 1000"),
    ("resources: {cpus: .nan}", "resources.cpus", "positive number"),
    ("resources: {cpus: .inf}", "resources.cpus", "positive number"),
    ("resources: {cpus: -2}", "resources.cpus", "positive number"),
    ("resources: {cpus: 1e300}", "resources.cpus", "at most 10000"),
    ("resources: {cpus: 'nan+'}", "resources.cpus", "positive number"),
    ("resources: {memory: 1e12}", "resources.memory", "at most 1e+06"),
    ("resources: {accelerators: 'A100:inf'}", "resources.accelerators", "positive count"),
    ("resources: {accelerators: {A100: [1]}}", "resources.accelerators", "{NAME: COUNT}"),
    ("resources: {disk_size: 10000000}", "resources.disk_size", "from 1 to 65536"),
    ("resources: {autostop: .nan}", "resources.autostop", "positive number"),
    ("resources: {autostop: {idle_minutes: 1e12}}", "resources.autostop.idle_minutes",
     "at most"),
    ("resources: {labels: {a: [1, 2]}}", "resources.labels.'a'", "a string"),
    ("resources: {labels: {a: {b: c}}}", "resources.labels.'a'", "a string"),
    ("resources: {ports: [[1, 2]]}", "resources.ports", "a port or a range"),
    ("resources: {ports: 70000}", "resources.ports", "is not a port"),
    ("resources: {ports: '10-5'}", "resources.ports", "is not a port"),
    ("resources: {region: [a]}", "resources.region", "expected a name"),
    ("workdir: {url: '-uhttp://x', ref: main}", "workdir.url", "starts with '-'"),
    ("workdir: {url: 'https://x/r.git', ref: '--upload-pack=touch /tmp/x'}", "workdir.ref",
     "starts with '-'"),
    ("workdir: {url: 'https://x/r.git', ref: [main]}", "workdir.ref", "a branch"),
])
def test_numbers_and_scalars_are_checked(text: str, field: str, words: str | None) -> None:
    error = task_error(f"run: echo\n{text}\n")
    assert error.message.startswith(f"t.yaml: {field}"), error.message
    if words:
        assert words in error.message, error.message


def _blocking_path_is_refused(path: Path) -> None:
    outcome: list[BaseException | None] = []

    def load() -> None:
        try:
            load_task(yaml_path=str(path))
            outcome.append(None)
        except BaseException as exc:
            outcome.append(exc)

    thread = threading.Thread(target=load, daemon=True)
    thread.start()
    thread.join(5)
    assert not thread.is_alive(), f"reading {path} blocked"
    error = outcome[0]
    assert isinstance(error, TaskError) and "not a regular file" in error.message, error


def test_a_fifo_task_path_never_blocks(tmp_path: Path) -> None:
    fifo = tmp_path / "task.yaml"
    os.mkfifo(fifo)
    _blocking_path_is_refused(fifo)


def test_a_device_task_path_is_refused() -> None:
    _blocking_path_is_refused(Path("/dev/zero"))


def test_read_regular_file_stops_at_its_bound(tmp_path: Path) -> None:
    big = tmp_path / "big"
    big.write_bytes(b"x" * 1001)
    with pytest.raises(OSError, match="larger than 1000 bytes"):
        read_regular_file(str(big), 1000)
    assert read_regular_file(str(big), 1001) == b"x" * 1001


@pytest.mark.parametrize(("host", "field"), [
    ("-oProxyCommand=touch /tmp/pwned", "ip"),
    ("10.0.0.1\n  ProxyCommand evil", "ip"),
    ("bad host", "ip"),
    ({"ip": "10.0.0.1", "user": "x\nProxyCommand evil"}, "user"),
    ({"ip": "10.0.0.1", "user": "-oProxy"}, "user"),
])
def test_pool_addresses_and_users_are_validated(tmp_path: Path, host: object,
                                                field: str) -> None:
    import yaml

    path = tmp_path / "pools.yaml"
    path.write_text(yaml.safe_dump({"p": {"hosts": [host]}}))
    with pytest.raises(PoolFileError) as error:
        load_pools(path)
    assert f"p.hosts[0].{field}" in error.value.message


def test_pool_and_config_files_refuse_alias_bombs(tmp_path: Path) -> None:
    path = tmp_path / "pools.yaml"
    path.write_text(BILLION_LAUGHS.replace("run: echo hi", "p: {hosts: *i}"))
    with pytest.raises(PoolFileError, match="expands to more than"):
        load_pools(path)
    with pytest.raises(ConfigError, match="expands to more than"):
        parse(tmp_path / "config.yaml", BILLION_LAUGHS)
    fifo = tmp_path / "fifo.yaml"
    os.mkfifo(fifo)
    with pytest.raises(PoolFileError, match="not a regular file"):
        load_pools(fifo)
