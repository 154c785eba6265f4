"""SkyPilot's flags of `launch` and `exec`: parsed by clusterctl, carried by RunArgs (sent only
when set, for older daemons), and applied to the task by the daemon's one table of overrides,
as SkyPilot applies them."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterctl import protocol
from clusterctl._render import render_plan
from clusterctl._task_options import dotenv_values, task_args
from clusterctl.cli import parse
from clusterd.providers.offered import fields_page
from clusterd.tasks.common import TaskError
from clusterd.tasks.loader import load_task
from clusterd.tasks.overrides import RESOURCE_OVERRIDES, apply_overrides
from clusterd.tasks.spec import Resources, TaskSpec


def launch_args(*words: str) -> protocol.LaunchArgs:
    args = parse(["launch", "-c", "dev", *words])
    request: protocol.LaunchArgs = task_args(
        args, protocol.LaunchArgs, cluster=args.cluster, infra=args.infra,
        idle_minutes=args.idle_minutes, down=args.down, retry_until_up=args.retry_until_up)
    return request


def test_every_flag_reaches_the_launch_request() -> None:
    request = launch_args(
        "--gpus", "A100:2", "--memory", "32+", "--use-spot", "--instance-type", "p4d.24xlarge",
        "--disk-size", "100", "--ports", "8080", "--ports", "10000-10010", "--image-id",
        "ami-1", "--workdir", "src", "--no-setup", "--dryrun", "-r", "-y", "--fast",
        "--", "python", "train.py")
    assert (request.gpus, request.memory, request.use_spot) == ("A100:2", "32+", True)
    assert (request.instance_type, request.disk_size, request.image_id) == (
        "p4d.24xlarge", 100, "ami-1")
    assert request.ports == ["8080", "10000-10010"] and request.workdir == "src"
    assert request.no_setup and request.dryrun and request.retry_until_up
    assert request.command == "python train.py"
    assert launch_args("--no-use-spot", "--", "true").use_spot is False
    assert launch_args("--", "true").use_spot is None  # the task's own


def test_exec_takes_the_resource_flags_but_not_launch_only_ones(
        capsys: pytest.CaptureFixture[str]) -> None:
    args = parse(["exec", "dev", "--gpus", "A100", "--dryrun", "--", "true"])
    request = task_args(args, protocol.ExecArgs, cluster="dev")
    assert request.gpus == "A100" and request.dryrun and not request.no_setup
    for launch_only in ("--no-setup", "--fast", "-y"):
        with pytest.raises(SystemExit) as exit_:
            parse(["exec", "dev", launch_only, "--", "true"])
        assert exit_.value.code == 2
    assert "unrecognized arguments" in capsys.readouterr().err


def test_json_goes_with_dryrun_only(capsys: pytest.CaptureFixture[str]) -> None:
    assert parse(["launch", "--dryrun", "--json", "--", "true"]).json
    with pytest.raises(SystemExit) as exit_:
        parse(["launch", "--json", "--", "true"])
    assert exit_.value.code == 2
    assert "--json goes with --dryrun" in capsys.readouterr().err


def test_env_file_is_read_as_dotenv_and_env_wins(tmp_path: Path) -> None:
    env_file = tmp_path / ".env"
    env_file.write_text(
        "# a comment\n\nPLAIN=one two  # trailing comment\nexport EXPORTED=yes\n"
        "SINGLE='kept # as $written'\nDOUBLE=\"line\\nnext \\\"q\\\"\"\nEMPTY=\nWON=file\n")
    assert dotenv_values(str(env_file)) == {
        "PLAIN": "one two", "EXPORTED": "yes", "SINGLE": "kept # as $written",
        "DOUBLE": 'line\nnext "q"', "EMPTY": "", "WON": "file"}
    request = launch_args("--env-file", str(env_file), "--env", "WON=flag", "--", "true")
    assert request.envs["WON"] == "flag" and request.envs["EXPORTED"] == "yes"


@pytest.mark.parametrize("line", ["no equals sign", "1ST=x", "BAD-NAME=x", "=x"])
def test_a_bad_env_file_line_is_refused_by_its_number(
        tmp_path: Path, line: str, capsys: pytest.CaptureFixture[str],
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.env").write_text(f"OK=1\n{line}\n")
    with pytest.raises(SystemExit) as exit_:
        dotenv_values("bad.env")
    assert exit_.value.code == 1
    assert "--env-file bad.env, line 2: expected NAME=VALUE" in capsys.readouterr().err


def test_a_missing_env_file_is_an_error(tmp_path: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit):
        dotenv_values(str(tmp_path / "none.env"))
    assert "cannot read it" in capsys.readouterr().err


def test_newer_arguments_are_sent_only_when_set() -> None:
    plain = protocol.to_wire(launch_args("--", "true"))
    # A daemon from before RunArgs refuses arguments it does not know: none is sent unset.
    assert not protocol.LaunchArgs._newer & plain.keys()
    assert {"cpus", "envs", "retry_until_up"} <= plain.keys()
    wire = protocol.to_wire(launch_args("--gpus", "A100", "--no-use-spot", "--", "true"))
    assert wire["gpus"] == "A100" and wire["use_spot"] is False
    assert protocol.parse_args(protocol.LaunchArgs, wire) == launch_args(
        "--gpus", "A100", "--no-use-spot", "--", "true")
    assert protocol.FEATURE_RUN_OVERRIDES in protocol.FEATURES


TASK = """
resources:
  cpus: 2
  ports: 80
  any_of:
    - accelerators: A100:1
      infra: aws/us-east-1
    - accelerators: H100:1
      infra: aws/us-west-2
setup: echo setup
run: echo run
"""


def task(text: str = TASK, cwd: str = "/") -> TaskSpec:
    return load_task(yaml_text=text, source="t.yaml", cwd=cwd)


def test_each_resource_flag_sets_its_field_everywhere_in_the_task() -> None:
    given = {"cpus": "4+", "memory": "32", "gpus": "V100:2", "instance_type": "p3.8xlarge",
             "use_spot": True, "disk_size": 200, "ports": ["8080", "10000-10010"],
             "image_id": "ami-1"}
    assert set(given) == set(RESOURCE_OVERRIDES)
    done = apply_overrides(task(), cpus=given.pop("cpus"), resources=given)
    assert len(done.resource_choices) == 2  # still two places
    for resources in (done.resources, *done.resource_choices):
        assert (resources.cpus, resources.cpus_at_least) == (4, True)
        assert (resources.memory_gb, resources.memory_at_least) == (32, False)
        assert (resources.accelerator, resources.accelerator_count) == ("V100", 2)
        assert (resources.instance_type, resources.use_spot) == ("p3.8xlarge", True)
        assert (resources.disk_size_gb, resources.image_id) == (200, "ami-1")
        assert resources.ports == ("8080", "10000-10010")
    assert {str(r.infra) for r in done.resource_choices} == {"aws/us-east-1", "aws/us-west-2"}


def test_alternatives_made_one_by_a_flag_are_one() -> None:
    text = "resources:\n  accelerators: {A100: 1, H100: 1}\nrun: x\n"
    assert len(task(text).resource_choices) == 2
    done = apply_overrides(task(text), resources={"gpus": "L4"})
    assert done.resource_choices == () and done.resources.accelerator == "L4"


def test_none_clears_a_field_as_in_skypilot() -> None:
    done = apply_overrides(task(), resources={"gpus": "none", "ports": ["NONE"]})
    assert all(r.accelerator is None and r.ports == () for r in done.resource_options())
    image = task("resources:\n  image_id: {us-east-1: ami-1}\nrun: x\n")
    assert apply_overrides(image, resources={"image_id": "none"}).resources == Resources()
    with pytest.raises(TaskError, match="--ports: `none` clears the field: give it alone"):
        apply_overrides(task(), resources={"ports": ["none", "80"]})


@pytest.mark.parametrize(("argument", "value", "said"), [
    ("gpus", "A100:lots", "--gpus: resources.accelerators: count must be a number"),
    ("memory", "-1", "--memory: resources.memory: must be a positive number"),
    ("disk_size", 0, "--disk-size: resources.disk_size: expected GB"),
    ("ports", ["70000"], "--ports: resources.ports: '70000' is not a port"),
])
def test_a_bad_flag_is_refused_naming_it(argument: str, value: object, said: str) -> None:
    with pytest.raises(TaskError) as caught:
        apply_overrides(task(), resources={argument: value})
    assert caught.value.message.startswith(said)


def test_workdir_and_no_setup(tmp_path: Path) -> None:
    (tmp_path / "src").mkdir()
    done = apply_overrides(task(), workdir="src", cwd=str(tmp_path), no_setup=True)
    assert done.workdir == str(tmp_path / "src") and done.setup is None
    assert done.run == "echo run" and task().setup == "echo setup"
    with pytest.raises(TaskError, match=r"--workdir: workdir: .* is not a directory"):
        apply_overrides(task(), workdir="missing", cwd=str(tmp_path))


def test_the_compatibility_page_lists_every_flag() -> None:
    page = fields_page()
    for override in RESOURCE_OVERRIDES.values():
        assert f"| `{override.flag}` | `resources.{override.key}` |" in page
    for flag in ("--env-file", "--workdir", "--no-setup", "--dryrun", "--fast", "-r"):
        assert f"`{flag}" in page


def test_the_plan_is_printed_one_line_per_part() -> None:
    place = {"infra": "aws/us-east-1/us-east-1a", "instance_type": "p4d.24xlarge",
             "spot": True, "price_per_hour": 9.5, "cluster_price_per_hour": 19.0,
             "provider": "aws"}
    text = render_plan({
        "says": "a new cluster c", "placement": place, "resources": "2x[CPU:0.5, A100:8]",
        "requested": {"use_spot": True, "ports": ["8080"]},
        "alternatives": [{**place, "infra": "aws/us-east-1/us-east-1b", "price_per_hour": 9.9}],
        "more_alternatives": 3, "refused": [],
        "task": {"num_nodes": 2, "setup": False, "run": True, "ports": ["8080"], "envs": ["A"]},
        "sync": [{"field": "workdir", "source": "/w", "files": 1, "bytes": 2_500_000}],
        "buckets": [], "autostop": {"idle_minutes": 5, "down": True}, "warnings": ["w"]})
    assert text.splitlines() == [
        "plan:      a new cluster c (dry run: nothing is made)",
        "placement: aws/us-east-1/us-east-1a (p4d.24xlarge), spot",
        "price:     $9.500/h per node, $19.000/h for 2 nodes (catalog)",
        "resources: 2x[CPU:0.5, A100:8]",
        "asks:      use_spot=true, ports=[8080]",
        "then:      aws/us-east-1/us-east-1b (p4d.24xlarge), spot $9.900/h",
        "then:      and 3 more",
        "setup:     not run",
        "run:       a job",
        "ports:     8080",
        "envs:      A",
        "sync:      workdir: /w: 1 file, 2.5 MB",
        "autostop:  tear down after 5 idle minutes",
        "warning:   w",
    ]


def test_the_plan_says_where_a_price_comes_from_and_the_budgets_verdict() -> None:
    place = {"infra": "ssh/rack", "instance_type": None, "price_per_hour": 1.5,
             "cluster_price_per_hour": 3.0, "provider": "ssh",
             "price_source": "ssh pool rack price_per_hour"}
    budget = {"refused": "the monthly budget of $5 is exceeded", "skipped": [
        {"provider": "aws", "reason": "the aws budget of $1 is exceeded"}], "budgets": [
        {"left": 0.0, "monthly": 5.0, "level": "exceeded", "says": "the monthly budget: ..."}]}
    lines = render_plan({"says": "a new cluster c", "placement": place, "budget": budget,
                         "task": {"num_nodes": 2}}).splitlines()
    assert "price:     $1.500/h per node, $3.000/h for 2 nodes (ssh pool rack price_per_hour)" \
        in lines
    assert lines[-5:-2] == [
        "budget:    REFUSED: the monthly budget of $5 is exceeded",
        "budget:    aws skipped: the aws budget of $1 is exceeded",
        "budget:    $0.00 left (exceeded): the monthly budget: ...",
    ]


def test_words_after_dashes_are_a_command_even_when_they_end_in_yaml() -> None:
    assert launch_args("--", "ls hello.yaml").command == "ls hello.yaml"
    assert launch_args("--", "cat", "task.yaml").command == "cat task.yaml"
    assert launch_args("task.yaml").yaml_path.endswith("/task.yaml")  # without --: a task
