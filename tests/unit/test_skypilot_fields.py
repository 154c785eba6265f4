"""Every SkyPilot task field, one case each: its effect (in the loaded task, or what a provider
makes of it), or its refusal or warning, naming it. Task files written in SkyPilot's documented
format."""

from __future__ import annotations

from pathlib import Path

import pytest

from clusterd.node_shared import containers
from clusterd.providers.aws.limits import ebs_volume
from clusterd.providers.offered import OFFERED, fields_page
from clusterd.tasks import fields
from clusterd.tasks.loader import TaskError, load_task
from clusterd.tasks.spec import TaskSpec

ROOT = Path(__file__).resolve().parents[2]


def load(text: str, tmp_path: Path | None = None, **kwargs: object) -> TaskSpec:
    return load_task(yaml_text=text, source="t.yaml", cwd=str(tmp_path or "/"), **kwargs)


def refusal(text: str, tmp_path: Path | None = None) -> str:
    with pytest.raises(TaskError) as caught:
        load(text, tmp_path)
    return caught.value.message


def test_the_compatibility_page_is_made_from_the_table() -> None:
    page = (ROOT / "docs" / "skypilot-compatibility.md").read_text()
    assert page == fields_page(), "run scripts/gen-docs"
    for field in fields.FIELDS:
        assert f"| `{field.path}` |" in page


def test_every_field_in_the_table_is_one_the_loader_knows() -> None:
    # Honoured and warned fields load; refused ones are refused by name; nothing is silent.
    for field in fields.FIELDS:
        if field.path.count(".") > 1:
            continue  # autostop's keys: their own cases below
        path = field.path.split(".")
        if path[0] == "resources" and len(path) == 1:
            continue
        if field.support in (fields.Support.REFUSED, fields.Support.PLANNED):
            text = (f"{path[0]}: {{}}\n" if len(path) == 1
                    else f"resources:\n  {path[1]}: x\n")
            assert refusal(text).startswith(f"t.yaml: {field.path}: not supported"), field


# -- the task ----------------------------------------------------------------------------


def test_name_num_nodes_setup_run_envs_secrets() -> None:
    spec = load("name: train\nnum_nodes: 3\nsetup: pip install x\nrun: python t.py\n"
                "envs:\n  LR: 0.1\nsecrets:\n  TOKEN: s3cr3t\n")
    assert (spec.name, spec.num_nodes, spec.setup, spec.run) == (
        "train", 3, "pip install x", "python t.py")
    assert spec.envs == {"LR": "0.1"} and spec.secrets == {"TOKEN": "s3cr3t"}


def test_workdir_and_file_mounts_fill_variables_from_envs(tmp_path: Path) -> None:
    (tmp_path / "code-v2").mkdir()
    (tmp_path / "data-v2.csv").write_text("x")
    spec = load("envs:\n  VERSION: v1\nworkdir: code-${VERSION}\n"
                "file_mounts:\n  /data/$VERSION/in.csv: data-${VERSION}.csv\n",
                tmp_path, env_overrides={"VERSION": "v2"})
    assert spec.workdir == str(tmp_path / "code-v2")
    assert spec.file_mounts == {"/data/v2/in.csv": str(tmp_path / "data-v2.csv")}
    missing = refusal("workdir: code-${NOPE}\n", tmp_path)
    assert "workdir" in missing and "code-${NOPE}" in missing


def test_git_workdir() -> None:
    spec = load("workdir:\n  url: https://example.com/r.git\n  ref: v1\n")
    assert (spec.workdir.url, spec.workdir.ref) == ("https://example.com/r.git", "v1")  # type: ignore[union-attr]


@pytest.mark.parametrize("field", ["volumes", "service", "pool", "experimental",
                                   "event_callback"])
def test_skypilot_only_fields_are_refused_by_name_saying_why(field: str) -> None:
    message = refusal(f"run: x\n{field}: {{a: 1}}\n")
    assert message.startswith(f"t.yaml: {field}: not supported")
    assert fields.BY_PATH[field].note in message


@pytest.mark.parametrize("field", ["inputs", "outputs"])
def test_optimizer_hints_are_warned(field: str) -> None:
    spec = load(f"run: x\n{field}: {{s3://b: 1}}\n")
    assert len(spec.warnings) == 1 and spec.warnings[0].startswith(f"{field}: has no effect")


def test_unknown_fields_are_refused_with_what_is_known() -> None:
    with pytest.raises(TaskError) as caught:
        load("runn: x\n")
    assert caught.value.message == "t.yaml: runn: unknown field"
    assert "run" in caught.value.hint and "volumes" not in caught.value.hint


def test_a_pipeline_is_refused_saying_what_it_is() -> None:
    message = refusal("name: a\nrun: x\n---\nname: b\nrun: y\n---\nname: c\nrun: z\n")
    assert "a SkyPilot pipeline of 3 tasks" in message


# -- resources ---------------------------------------------------------------------------


def test_infra_and_the_legacy_cloud_region_zone() -> None:
    assert str(load("resources:\n  infra: aws/us-east-1/us-east-1a\n").resources.infra) == (
        "aws/us-east-1/us-east-1a")
    legacy = load("resources:\n  cloud: AWS\n  region: us-west-2\n  zone: us-west-2b\n")
    assert str(legacy.resources.infra) == "aws/us-west-2/us-west-2b"


@pytest.mark.parametrize(("written", "expected"), [
    ("A100:8", [("A100", 8)]),
    ("{A100: 8}", [("A100", 8)]),
    ("V100", [("V100", 1)]),
    ("{H100: 8, H200: 8}", [("H100", 8), ("H200", 8)]),
    ("[L4, 'A10G:1']", [("L4", 1), ("A10G", 1)]),
])
def test_accelerators_and_their_alternatives(written: str, expected: list[tuple[str, float]]
                                             ) -> None:
    spec = load(f"resources:\n  accelerators: {written}\n")
    got = [(r.accelerator, r.accelerator_count) for r in spec.resource_options()]
    assert got == expected
    assert not spec.choices_ordered


def test_gpus_is_an_alias_of_accelerators() -> None:
    assert load("resources:\n  gpus: T4:2\n").resources.accelerator == "T4"
    assert "not both" in refusal("resources:\n  gpus: T4\n  accelerators: T4\n")


def test_accelerator_choices_inside_any_of_multiply() -> None:
    spec = load("resources:\n  any_of:\n    - infra: aws/us-east-1\n"
                "      accelerators: {H100: 8, A100: 8}\n    - infra: aws/us-west-2\n"
                "      accelerators: H100:8\n")
    assert [(str(r.infra), r.accelerator) for r in spec.resource_options()] == [
        ("aws/us-east-1", "H100"), ("aws/us-east-1", "A100"), ("aws/us-west-2", "H100")]


@pytest.mark.parametrize("field", ["accelerator_args", "job_recovery", "spot_recovery",
                                   "network_tier"])
def test_fields_without_effect_are_warned_by_name(field: str) -> None:
    value = {"accelerator_args": "{runtime_version: tpu-vm-base}", "job_recovery": "none",
             "spot_recovery": "FAILOVER", "network_tier": "best"}[field]
    spec = load(f"resources:\n  {field}: {value}\n")
    assert [w.split(":")[0] for w in spec.warnings] == [f"resources.{field}"]
    assert "has no effect" in spec.warnings[0]


def test_cpus_memory_instance_type_use_spot_disk() -> None:
    r = load("resources:\n  cpus: 4+\n  memory: 32\n  instance_type: m6i.2xlarge\n"
             "  use_spot: true\n  disk_size: 512\n  disk_tier: High\n").resources
    assert (r.cpus, r.cpus_at_least, r.memory_gb, r.memory_at_least) == (4, True, 32, False)
    assert (r.instance_type, r.use_spot, r.disk_size_gb, r.disk_tier) == (
        "m6i.2xlarge", True, 512, "high")
    assert "resources.disk_tier: must be one of" in refusal("resources:\n  disk_tier: fast\n")
    assert "resources.network_tier: must be one of" in refusal(
        "resources:\n  network_tier: 10g\n")


def test_disk_tiers_are_the_ebs_volumes_skypilot_picks() -> None:
    assert ebs_volume("low") == {"VolumeType": "standard"}
    assert ebs_volume(None) == ebs_volume("medium") == {
        "VolumeType": "gp3", "Iops": 3500, "Throughput": 218}
    assert ebs_volume("high") == {"VolumeType": "gp3", "Iops": 7000, "Throughput": 437}
    assert ebs_volume("ultra") == ebs_volume("best") == {"VolumeType": "io2", "Iops": 20000}


def test_max_hourly_cost() -> None:
    assert load("resources:\n  max_hourly_cost: 2.5\n").resources.max_hourly_cost == 2.5
    assert "resources.max_hourly_cost" in refusal("resources:\n  max_hourly_cost: -1\n")


def test_image_id_forms() -> None:
    assert load("resources:\n  image_id: ami-0123\n").resources.image_id == "ami-0123"
    mapped = load("resources:\n  image_id:\n    us-east-1: ami-1\n    us-west-2: ami-2\n")
    assert mapped.resources.region_images == (("us-east-1", "ami-1"), ("us-west-2", "ami-2"))
    docker = load("resources:\n  image_id: docker:ubuntu:22.04\n").resources
    assert containers.image_of(docker.image_id) == "ubuntu:22.04"
    assert refusal("resources:\n  image_id: [a]\n").startswith("t.yaml: resources.image_id:")


DIGEST = "sha256:" + "ab" * 32


@pytest.mark.parametrize("image", [
    "ubuntu", "ubuntu:22.04", "library/ubuntu", "localhost/clusterd-test:1",
    "localhost:5000/team/img:v1.2-rc_3", "ghcr.io/org/sub/img", f"ghcr.io/org/img@{DIGEST}",
    f"registry.example.com:443/a/b:tag@{DIGEST}", "[::1]:5000/img:1", "a__b.c-d/e---f:T_1",
    "127.0.0.1:5000/x",
])
def test_docker_image_references_that_load(image: str) -> None:
    loaded = load(f"resources:\n  image_id: 'docker:{image}'\n").resources
    assert containers.image_of(loaded.image_id) == image


@pytest.mark.parametrize("image", [
    "--cidfile=/tmp/x", "-v", "-", "ubuntu --privileged", "ubuntu\tx", "Ubuntu", "org/UPPER",
    "ubuntu:", ":tag", "ubuntu@sha256:abc", "ubuntu@" + "ab" * 32, "a//b", "/abs", "a/",
    "a:b:c", "a:" + "t" * 129, "a" * 256, "a/-b", "a/b-", "a.-b", "host:port/x", "ünicode",
    "x;rm -rf /", "$(id)", "a\\nb", "a:t\u00e4g", "",
])
def test_docker_image_references_that_are_refused(image: str) -> None:
    message = refusal(f"resources:\n  image_id: 'docker:{image}'\n")
    assert message.startswith("t.yaml: resources.image_id: "), message
    assert "image reference" in message


def test_a_bad_image_in_a_choice_names_its_place() -> None:
    message = refusal("resources:\n  any_of:\n    - cpus: 1\n    - image_id: docker:-v\n")
    assert message.startswith("t.yaml: resources.any_of[1].image_id: ")


def test_the_container_command_ends_options_before_the_image() -> None:
    argv = containers.command("/usr/bin/podman", "ubuntu:22.04", "/p/job.sh", "/w", ["A"])
    assert argv[argv.index("--") + 1:] == ["ubuntu:22.04", "sh", "-c", containers.SHELL,
                                           "/p/job.sh"]
    with pytest.raises(containers.BadImage, match="--cidfile=/tmp/x"):
        containers.command("/usr/bin/podman", "--cidfile=/tmp/x", "/p/job.sh", "/w", [])


def test_ports_labels_autostop() -> None:
    r = load("resources:\n  ports: [8080, '9000-9010']\n  labels: {team: ml}\n"
             "  autostop: {idle_minutes: 10, down: true, wait_for: jobs}\n").resources
    assert r.ports == ("8080", "9000-9010") and r.labels == (("team", "ml"),)
    assert r.autostop is not None and (r.autostop.idle_minutes, r.autostop.down) == (10, True)
    hooked = refusal("resources:\n  autostop:\n    idle_minutes: 5\n    hook: git push\n")
    assert hooked.startswith("t.yaml: resources.autostop.hook: not supported yet")


def test_any_of_and_ordered() -> None:
    spec = load("resources:\n  ordered:\n    - infra: aws/us-east-1\n    - infra: local\n")
    assert spec.choices_ordered and [r.infra.provider for r in spec.resource_options()] == [
        "aws", "local"]
    assert "t.yaml: resources.any_of[1].cpus:" in refusal(
        "resources:\n  any_of:\n    - cpus: 2\n    - cpus: lots\n")


# -- what a provider makes of the fields that apply on some providers only --------------


@pytest.mark.parametrize(("text", "provider", "warned", "refused"), [
    ("instance_type: m6i.large", "local", [], ["resources.instance_type"]),
    ("instance_type: m6i.large", "ssh", [], ["resources.instance_type"]),
    ("instance_type: m6i.large", "aws", [], []),
    ("use_spot: true", "local", ["resources.use_spot"], []),
    ("disk_size: 100", "ssh", ["resources.disk_size"], []),
    ("disk_tier: high", "local", ["resources.disk_tier"], []),
    ("disk_tier: high", "aws", [], []),
    ("image_id: ami-1", "local", [], ["resources.image_id"]),
    ("image_id: docker:alpine", "local", [], []),
    ("image_id: docker:alpine", "ssh", [], []),
    ("ports: 8080", "ssh", ["resources.ports"], []),
    ("ports: 8080", "local", [], []),
    ("labels: {a: b}", "local", ["resources.labels"], []),
    ("labels: {a: b}", "aws", [], []),
])
def test_fields_on_providers(text: str, provider: str, warned: list[str],
                             refused: list[str]) -> None:
    resources = load(f"resources:\n  {text}\n").resources
    honoured = {cls.name: cls.honoured_fields for cls in OFFERED}[provider]
    warnings, refusals = fields.on_provider(resources, provider, honoured)
    assert [w.split(":")[0] for w in warnings] == warned
    assert [r.split(":")[0] for r in refusals] == refused
    for message in warnings + refusals:
        assert provider in message


def test_no_container_runtime_is_said_plainly(monkeypatch: pytest.MonkeyPatch,
                                              tmp_path: Path) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    runtime, why = containers.find_runtime()
    assert runtime is None and why == "no docker; no podman"
