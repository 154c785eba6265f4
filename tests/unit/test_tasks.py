"""Task YAML loading (clusterd.tasks.loader) and the typed spec (clusterd.tasks.spec)."""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import pytest

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.tasks import (
    Autostop,
    GitWorkdir,
    Infra,
    Resources,
    TaskError,
    TaskSpec,
    load_task,
    parse_autostop,
)
from clusterd.tasks.spec import DEFAULT_JOB_CPUS


def load(text: str, **kwargs: object) -> TaskSpec:
    return load_task(yaml_text=text, source="t.yaml", **kwargs)  # type: ignore[arg-type]


def task_error(text: str, **kwargs: object) -> TaskError:
    with pytest.raises(TaskError) as info:
        load(text, **kwargs)
    assert info.value.code == ErrorCode.INVALID_TASK
    return info.value


# --------------------------------------------------------------------------------------------
# Sources: text, command, path


def test_load_yaml_text_full_task(tmp_path: Path) -> None:
    (tmp_path / "code").mkdir()
    (tmp_path / "data.txt").write_text("x")
    spec = load(
        """
name: train
setup: pip install -r requirements.txt
run: python train.py
num_nodes: 2
workdir: code
file_mounts:
  /remote/data.txt: data.txt
envs:
  LR: 0.1
  DEBUG: true
resources:
  infra: aws/us-east-1
  cpus: 4+
  memory: 16GB+
  accelerators: A100:2
  use_spot: true
  disk_size: 100
  ports: 8080
  labels: {team: ml}
""",
        cwd=str(tmp_path),
    )
    assert spec.name == "train"
    assert spec.setup == "pip install -r requirements.txt"
    assert spec.run == "python train.py"
    assert spec.num_nodes == 2
    assert spec.workdir == str(tmp_path / "code")
    assert spec.file_mounts == {"/remote/data.txt": str(tmp_path / "data.txt")}
    assert spec.envs == {"LR": "0.1", "DEBUG": "true"}
    assert spec.source == "t.yaml"
    assert spec.resources == Resources(
        infra=Infra("aws", "us-east-1", None),
        cpus=4.0,
        cpus_at_least=True,
        memory_gb=16.0,
        memory_at_least=True,
        accelerator="A100",
        accelerator_count=2.0,
        use_spot=True,
        disk_size_gb=100,
        ports=("8080",),
        labels=(("team", "ml"),),
    )


def test_load_command_makes_a_run_only_task() -> None:
    spec = load_task(command="echo hi", source="ignored")
    assert spec == TaskSpec(run="echo hi", source="<command>")
    assert spec.resources.job_cpus == DEFAULT_JOB_CPUS


def test_load_empty_command_is_an_error() -> None:
    with pytest.raises(TaskError) as info:
        load_task(command="   ")
    assert "the command is empty" in info.value.message


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"yaml_text": "run: x", "command": "x"}, {"yaml_path": "/a", "yaml_text": "run: x"}],
)
def test_load_needs_exactly_one_source(kwargs: dict[str, str]) -> None:
    with pytest.raises(ProtocolError) as info:
        load_task(**kwargs)  # type: ignore[arg-type]
    assert info.value.code == ErrorCode.INVALID_ARGUMENT


def test_load_yaml_path_relative_to_cwd(tmp_path: Path) -> None:
    (tmp_path / "task.yaml").write_text("run: echo from file\n")
    spec = load_task(yaml_path="task.yaml", cwd=str(tmp_path))
    assert spec.run == "echo from file"
    assert spec.source == "task.yaml"


def test_load_yaml_path_errors_name_the_file(tmp_path: Path) -> None:
    (tmp_path / "bad.yaml").write_text("run: echo\nnum_nodes: 0\n")
    with pytest.raises(TaskError) as info:
        load_task(yaml_path=str(tmp_path / "bad.yaml"))
    assert info.value.message == (
        f"{tmp_path / 'bad.yaml'}: num_nodes: must be a whole number from 1 to 1000, got 0"
    )


def test_load_yaml_path_not_found(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as info:
        load_task(yaml_path="missing.yaml", cwd=str(tmp_path))
    assert info.value.code == ErrorCode.INVALID_TASK
    assert info.value.message == "missing.yaml: file not found"


def test_load_yaml_path_that_is_a_directory(tmp_path: Path) -> None:
    with pytest.raises(TaskError) as info:
        load_task(yaml_path=str(tmp_path))
    assert info.value.message == f"{tmp_path}: is a directory, not a task YAML"


def test_load_yaml_path_not_utf8(tmp_path: Path) -> None:
    (tmp_path / "t.yaml").write_bytes(b"run: \xff\xfe\n")
    with pytest.raises(TaskError) as info:
        load_task(yaml_path="t.yaml", cwd=str(tmp_path))
    assert info.value.message == "t.yaml: is not UTF-8 text"


def test_empty_yaml_is_an_empty_task() -> None:
    assert load("") == TaskSpec(source="t.yaml")
    assert load("# only a comment\n") == TaskSpec(source="t.yaml")


# --------------------------------------------------------------------------------------------
# Errors name the file and the field


def test_bad_yaml_reports_line_and_column() -> None:
    error = task_error("name: a\nrun: [unclosed\n")
    assert error.message.startswith("t.yaml: not valid YAML: line 3, column 1: ")
    error = task_error("run: echo\na: b: c\n")
    assert error.message == (
        "t.yaml: not valid YAML: line 2, column 5: mapping values are not allowed in this context"
    )


@pytest.mark.parametrize(("text", "kind"), [("- 1\n- 2\n", "a list"), ("just words", "a string"),
                                            ("42", "a number")])
def test_non_map_yaml(text: str, kind: str) -> None:
    assert task_error(text).message == f"t.yaml: a task must be a map of fields, got {kind}"


def test_unknown_top_level_field() -> None:
    error = task_error("run: x\nnum_node: 2\n")
    assert error.message == "t.yaml: num_node: unknown field"
    assert "num_nodes" in error.hint


@pytest.mark.parametrize("field", ["service", "volumes", "pool"])
def test_unsupported_skypilot_field(field: str) -> None:
    error = task_error(f"run: x\n{field}: {{}}\n")
    assert error.message.startswith(f"t.yaml: {field}: not supported")


@pytest.mark.parametrize("value", ["0", "-1", "'2'", "1.5", "true"])
def test_num_nodes_must_be_whole_positive(value: str) -> None:
    error = task_error(f"num_nodes: {value}\n")
    assert error.message.startswith(
        "t.yaml: num_nodes: must be a whole number from 1 to 1000, got ")


def test_cpus_error_names_the_field() -> None:
    assert task_error("resources:\n  cpus: [1]\n").message == (
        "t.yaml: resources.cpus: expected a number or a string like '4+', got a list"
    )
    assert task_error("resources:\n  cpus: lots\n").message == (
        "t.yaml: resources.cpus: expected a number or a string like '4+', got 'lots'"
    )
    assert task_error("resources:\n  cpus: 0\n").message == (
        "t.yaml: resources.cpus: must be a positive number, got 0"
    )
    assert task_error("resources:\n  cpus: true\n").message == (
        "t.yaml: resources.cpus: expected a number, got a boolean"
    )


def test_env_with_null_value_hints_the_flag() -> None:
    error = task_error("envs:\n  FOO:\n  BAR: 1\n")
    assert error.message == "t.yaml: envs.FOO: has no value"
    assert error.hint == "pass it with --env FOO=VALUE"


def test_secret_with_null_value_hints_the_secret_flag() -> None:
    error = task_error("secrets:\n  TOKEN: null\n")
    assert error.message == "t.yaml: secrets.TOKEN: has no value"
    assert error.hint == ("pass it with --secret TOKEN (the value comes from your environment, "
                          "never the command line)")


def test_env_name_and_value_checks() -> None:
    assert task_error("envs:\n  1BAD: x\n").message == (
        "t.yaml: envs.1BAD: is not a valid environment variable name"
    )
    assert task_error("envs:\n  A: [1]\n").message == (
        "t.yaml: envs.A: expected a string, got a list"
    )
    assert task_error("envs: [A]\n").message == (
        "t.yaml: envs: expected a map of NAME: value, got a list"
    )
    error = task_error("run: x\n", env_overrides={"BAD-NAME": "1"})
    assert error.message == "t.yaml: --env BAD-NAME: is not a valid environment variable name"


def test_env_name_with_trailing_newline_is_rejected() -> None:
    error = task_error('envs:\n  "FOO\\n": x\n')
    assert error.message == "t.yaml: envs.FOO\n: is not a valid environment variable name"


def test_overrides_win_over_yaml_and_fill_nulls() -> None:
    spec = load(
        "envs:\n  A: yaml\n  B:\n  C: keep\nsecrets:\n  TOKEN:\n  KEY: yaml\n",
        env_overrides={"A": "cli", "B": "filled", "NEW": "n"},
        secret_overrides={"TOKEN": "t0k", "KEY": "cli-key"},
    )
    assert spec.envs == {"A": "cli", "B": "filled", "C": "keep", "NEW": "n"}
    assert spec.secrets == {"TOKEN": "t0k", "KEY": "cli-key"}


def test_unknown_and_unsupported_resource_fields() -> None:
    error = task_error("resources:\n  gpu: 1\n")
    assert error.message == "t.yaml: resources.gpu: unknown field"
    assert "accelerators" in error.hint
    error = task_error("resources:\n  any_of: []\n")
    assert error.message == "t.yaml: resources.any_of: expected a non-empty list of resources"


def test_any_of_and_ordered_merge_each_choice_over_the_base() -> None:
    spec = load("resources:\n  cpus: 4+\n  use_spot: true\n  any_of:\n"
                "    - infra: aws/us-east-1\n      accelerators: A100:8\n"
                "    - accelerators: H100:8\n      use_spot: false\n")
    assert not spec.choices_ordered and len(spec.resource_choices) == 2
    first, second = spec.resource_choices
    assert (str(first.infra), first.accelerator, first.cpus, first.use_spot) == (
        "aws/us-east-1", "A100", 4, True)
    assert (second.accelerator, second.use_spot, second.cpus_at_least) == ("H100", False, True)
    ordered = load("resources:\n  ordered:\n    - infra: local\n    - infra: aws\n")
    assert ordered.choices_ordered
    assert [r.infra.provider for r in ordered.resource_options()] == ["local", "aws"]
    error = task_error("resources:\n  any_of:\n    - cpus: many\n")
    assert error.message.startswith("t.yaml: resources.any_of[0].cpus: expected a number")
    error = task_error("resources:\n  any_of: [{}]\n  ordered: [{}]\n")
    assert "any_of or ordered, not both" in error.message


def test_infra_and_legacy_cloud_are_exclusive() -> None:
    error = task_error("resources:\n  infra: aws\n  cloud: gcp\n")
    assert error.message == "t.yaml: resources.infra: give either infra or cloud/region/zone"
    spec = load("resources:\n  cloud: AWS\n  region: us-west-2\n")
    assert spec.resources.infra == Infra("aws", "us-west-2", None)


def test_other_resource_field_errors() -> None:
    assert task_error("resources: [1]\n").message == "t.yaml: resources: expected a map, got a list"
    assert task_error("resources:\n  disk_size: 1.5\n").message == (
        "t.yaml: resources.disk_size: expected GB as a whole number from 1 to 65536, got 1.5"
    )
    assert task_error("resources:\n  use_spot: yes please\n").message == (
        "t.yaml: resources.use_spot: expected true or false, got 'yes please'"
    )
    assert task_error("resources:\n  infra: 3\n").message.startswith(
        "t.yaml: resources.infra: expected a string like 'aws/us-east-1'"
    )


# --------------------------------------------------------------------------------------------
# Resource forms


@pytest.mark.parametrize(
    ("cpus", "expected"),
    [("4", (4.0, False)), ("'4'", (4.0, False)), ("4+", (4.0, True)), ("' 2.5 + '", (2.5, True)),
     ("0.5", (0.5, False))],
)
def test_cpus_forms(cpus: str, expected: tuple[float, bool]) -> None:
    resources = load(f"resources:\n  cpus: {cpus}\n").resources
    assert (resources.cpus, resources.cpus_at_least) == expected
    assert resources.job_cpus == expected[0]


@pytest.mark.parametrize(
    ("memory", "expected"),
    [("16GB+", (16.0, True)), ("16GB", (16.0, False)), ("32", (32.0, False)),
     ("8g+", (8.0, True)), ("'64 GB'", (64.0, False))],
)
def test_memory_forms(memory: str, expected: tuple[float, bool]) -> None:
    resources = load(f"resources:\n  memory: {memory}\n").resources
    assert (resources.memory_gb, resources.memory_at_least) == expected


@pytest.mark.parametrize(
    ("accelerators", "expected"),
    [
        ("A100:2", ("A100", 2.0)),
        ("A100", ("A100", 1.0)),
        ("'T4:0.5'", ("T4", 0.5)),
        ("{A100: 2}", ("A100", 2.0)),
        ("{H100: null}", ("H100", 1.0)),
        ("[V100]", ("V100", 1.0)),
        ("['L4:4']", ("L4", 4.0)),
    ],
)
def test_accelerator_forms(accelerators: str, expected: tuple[str, float]) -> None:
    resources = load(f"resources:\n  accelerators: {accelerators}\n").resources
    assert (resources.accelerator, resources.accelerator_count) == expected


@pytest.mark.parametrize(
    ("accelerators", "message"),
    [
        ("[]", "the list of accelerators is empty"),
        ("{}", "expected {NAME: COUNT}, like {A100: 1}"),
        ("A100:x", "count must be a number, got 'x'"),
        ("A100:0", "expected a name and a positive count (at most 1024), got 'A100:0'"),
        ("3", "expected a string like 'A100:1', got a number"),
    ],
)
def test_accelerator_errors(accelerators: str, message: str) -> None:
    error = task_error(f"resources:\n  accelerators: {accelerators}\n")
    assert error.message == f"t.yaml: resources.accelerators: {message}"


@pytest.mark.parametrize(
    ("autostop", "expected"),
    [
        ("true", Autostop(5)),
        ("false", None),
        ("10", Autostop(10.0)),
        ("{idle_minutes: 0.5, down: true, wait_for: jobs}", Autostop(0.5, True, "jobs")),
        ("{down: true}", Autostop(5.0, True, "jobs_and_ssh")),
    ],
)
def test_autostop_forms(autostop: str, expected: Autostop | None) -> None:
    assert load(f"resources:\n  autostop: {autostop}\n").resources.autostop == expected


def test_autostop_errors() -> None:
    error = task_error("resources:\n  autostop: {idle_minutes: 1, wait_for: ssh}\n")
    assert error.message == (
        "t.yaml: resources.autostop.wait_for: must be one of jobs_and_ssh, jobs, none, got 'ssh'"
    )
    error = task_error("resources:\n  autostop: {idle: 1}\n")
    assert error.message == "t.yaml: resources.autostop.idle: unknown field"
    error = task_error("resources:\n  autostop: {down: 1}\n")
    assert error.message == "t.yaml: resources.autostop.down: expected true or false, got 1"
    with pytest.raises(TaskError) as info:
        parse_autostop([5], "cli", "--idle-minutes")
    assert info.value.message == "cli: --idle-minutes: expected true, minutes or a map, got a list"


# --------------------------------------------------------------------------------------------
# workdir and file_mounts


def test_workdir_relative_to_cwd_and_normalized(tmp_path: Path) -> None:
    (tmp_path / "a" / "b").mkdir(parents=True)
    spec = load("workdir: ./a/../a/b\n", cwd=str(tmp_path))
    assert spec.workdir == str(tmp_path / "a" / "b")
    spec = load(f"workdir: {tmp_path}\n", cwd="/")
    assert spec.workdir == str(tmp_path)


def test_workdir_must_be_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("x")
    error = task_error("workdir: file\n", cwd=str(tmp_path))
    assert error.message == f"t.yaml: workdir: {tmp_path / 'file'} is not a directory"
    error = task_error("workdir: nope\n", cwd=str(tmp_path))
    assert error.message == f"t.yaml: workdir: {tmp_path / 'nope'} is not a directory"


def test_git_workdir() -> None:
    spec = load("workdir:\n  url: https://example.com/r.git\n  ref: 123\n")
    assert spec.workdir == GitWorkdir("https://example.com/r.git", "123")
    assert task_error("workdir: {ref: main}\n").message == (
        "t.yaml: workdir.url: a git workdir needs a url"
    )


def test_file_mounts_local_path_must_exist(tmp_path: Path) -> None:
    error = task_error("file_mounts:\n  /data: missing\n", cwd=str(tmp_path))
    assert error.message == f"t.yaml: file_mounts./data: {tmp_path / 'missing'} does not exist"


def test_file_mounts_expand_user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    (tmp_path / "f").write_text("x")
    spec = load("file_mounts:\n  /r: ~/f\n", cwd="/elsewhere")
    assert spec.file_mounts == {"/r": os.path.join(str(tmp_path), "f")}


# --------------------------------------------------------------------------------------------
# Infra


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("aws/us-east-1/us-east-1a", Infra("aws", "us-east-1", "us-east-1a")),
        ("AWS/us-east-1", Infra("aws", "us-east-1", None)),
        ("k8s/my/ctx", Infra("kubernetes", "my/ctx", None)),
        ("kubernetes", Infra("kubernetes", None, None)),
        ("local", Infra("local", None, None)),
        ("*/us-east-1", Infra(None, "us-east-1", None)),
        ("*", Infra()),
        ("", Infra()),
        (None, Infra()),
    ],
)
def test_infra_parse(text: str | None, expected: Infra) -> None:
    assert Infra.parse(text) == expected


def test_infra_str() -> None:
    assert str(Infra()) == "*"
    assert str(Infra("aws", "us-east-1", "us-east-1a")) == "aws/us-east-1/us-east-1a"
    assert str(Infra.parse("k8s/my/ctx")) == "kubernetes/my/ctx"


def test_infra_with_zone_but_no_region_round_trips() -> None:
    infra = Infra.parse("aws/*/us-east-1a")
    assert infra == Infra("aws", None, "us-east-1a")
    assert Infra.parse(str(infra)) == infra


# --------------------------------------------------------------------------------------------
# TaskSpec and Resources views


def test_config_hash_stable_and_tracks_provisioning_fields() -> None:
    base = load("run: x\nresources:\n  cpus: 2\n")
    again = load("run: y\nresources:\n  cpus: 2\n")
    assert base.config_hash() == again.config_hash()
    assert len(base.config_hash()) == 16
    assert base.config_hash() == base.config_hash()

    assert load("num_nodes: 2\nresources:\n  cpus: 2\n").config_hash() != base.config_hash()
    assert load("resources:\n  cpus: 4\n").config_hash() != base.config_hash()
    assert load("resources:\n  cpus: 2+\n").config_hash() != base.config_hash()
    # Job-side settings do not change which nodes the cluster needs.
    assert load("envs: {A: 1}\nresources:\n  cpus: 2\n").config_hash() == base.config_hash()
    assert (
        load("resources:\n  cpus: 2\n  autostop: 10\n").config_hash() == base.config_hash()
    )


@pytest.mark.parametrize(
    "resources",
    [
        Resources(),
        Resources(
            infra=Infra("kubernetes", "my/ctx"),
            cpus=4.0,
            cpus_at_least=True,
            memory_gb=16.0,
            memory_at_least=True,
            accelerator="A100",
            accelerator_count=2.0,
            instance_type="p4d.24xlarge",
            use_spot=True,
            disk_size_gb=200,
            ports=("8080", "9000-9010"),
            image_id="docker:ubuntu",
            labels=(("a", "1"), ("b", "2")),
        ),
        Resources(infra=Infra("aws", "us-east-1", "us-east-1a")),
    ],
)
def test_resources_from_view_round_trips(resources: Resources) -> None:
    view = resources.provisioning_view()
    assert "autostop" not in view
    assert isinstance(view["infra"], str)
    assert Resources.from_view(view) == resources


def test_resources_from_view_accepts_json_lists() -> None:
    # A cluster record stores the view as JSON: tuples come back as lists.
    resources = Resources(ports=("22",), labels=(("k", "v"),))
    view = resources.provisioning_view()
    view["ports"] = list(view["ports"])
    view["labels"] = [list(pair) for pair in view["labels"]]
    assert Resources.from_view(view) == resources


def test_public_view_hides_secret_values() -> None:
    spec = load(
        "run: x\nenvs: {A: '1'}\nsecrets: {TOKEN: hunter2, API_KEY: abc}\n"
        "resources: {infra: aws/us-east-1}\n"
    )
    view = spec.public_view()
    assert view["secrets"] == ["API_KEY", "TOKEN"]
    assert view["envs"] == {"A": "1"}
    assert view["resources"]["infra"] == "aws/us-east-1"
    assert "hunter2" not in repr(view)
    assert "abc" not in repr(view)
    # The spec itself keeps them.
    assert spec.secrets == {"TOKEN": "hunter2", "API_KEY": "abc"}


def test_resources_display() -> None:
    assert Resources().display(1) == "1x[CPU:0.5]"
    resources = dataclasses.replace(
        Resources(), cpus=4.0, memory_gb=16.0, accelerator="A100", accelerator_count=2.0
    )
    assert resources.display(2) == "2x[CPU:4, mem:16GB, A100:2]"


def test_git_token_in_envs_is_a_secret() -> None:
    spec = load("envs:\n  GIT_TOKEN: ghp-x\n  A: '1'\nrun: echo\n")
    assert spec.envs == {"A": "1"} and spec.secrets == {"GIT_TOKEN": "ghp-x"}
    spec = load("run: echo\n", env_overrides={"GIT_TOKEN": "from-flag"})
    assert "GIT_TOKEN" not in spec.envs and spec.secrets == {"GIT_TOKEN": "from-flag"}
    assert spec.public_view()["secrets"] == ["GIT_TOKEN"]
