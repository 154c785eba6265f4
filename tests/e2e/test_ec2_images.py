"""Instances boot in their image's root, as on EC2 (`ec2 up --image-roots`): the bed's Ubuntu
22.04 is a Debian bullseye root (python3 3.9, no venv module, as 22.04's 3.10 has none), its
24.04 a trixie root (3.13), and its host-root image the machine's own. A 2-node job runs on
each; GPU instance types get AWS's Deep Learning Base GPU AMI (whose stand-in driver reports
the type's GPUs), and a GPU type booted from an image without the driver fails its launch
naming the driver and the image."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator

import pytest

from clusterd.runtime.node_platform import NodePlatform, probe_script
from clusterd.runtime.venv_archive import PYTHON_TAG
from tests import python_mirror
from tests.e2e.ec2bed import ROOT, EC2Bed, cloud_name, ec2_bed, running
from tests.python_oldglibc import old_glibc_archive
from tests.support import Daemon, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.ec2_images, pytest.mark.ray,
              pytest.mark.timeout(1800)]

# (owner, name pattern) of each image, as their publishers name them (the bed's regions.py)
JAMMY = ("099720109477", "ubuntu/images/hvm-ssd/ubuntu-jammy-22.04-amd64-server-*")
NOBLE = ("099720109477", "ubuntu/images/hvm-ssd-gp3/ubuntu-noble-24.04-amd64-server-*")
HOST = ("099720109477", "clusterd-testbed/host-root-amd64-*")
DLAMI = ("amazon", "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *")
NEURON = ("amazon", "Deep Learning AMI Neuron (Ubuntu 22.04) *")
HOST_CODENAME = subprocess.run(["sh", "-c", ". /etc/os-release; echo $VERSION_CODENAME"],
                               capture_output=True, text=True).stdout.strip()
# Where the bed's nodes find the Python mirror: its service address (scripts/_testbed/ec2/
# layout.py SERVICE_IP), the one way out of their VPC, as a real node's is the Internet.
MIRROR_HOST, MIRROR_PORT = "127.254.0.1", 4580
NODE_HOME = "/home/ubuntu"
ROOTS = ("import json, sys; sys.path.insert(0, 'scripts'); from _testbed.ec2 import images; "
         "print(json.dumps(images.ensure_all()))")

DESCRIBE = """
import boto3, json
ec2 = boto3.client("ec2", region_name="us-east-1")
images = ec2.describe_images(Owners=[OWNER], Filters=[{"Name": "name", "Values": [NAME]}])
print(json.dumps([i["ImageId"] for i in images["Images"]]))
"""
RUN = """
import boto3, json
ec2 = boto3.client("ec2", region_name="us-east-1")
subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
made = ec2.run_instances(ImageId=IMAGE, InstanceType=TYPE, MinCount=1, MaxCount=1,
                         SubnetId=subnet)
print(made["Instances"][0]["InstanceId"])
"""
TASK = """
name: images
num_nodes: 2
resources:
  cpus: 2
{extra}
run: |
  . /etc/os-release
  echo "rank=$SKYPILOT_NODE_RANK on $VERSION_CODENAME"
  sed -n 's/^home = /python in /p' ~/.clusterd/current/pyvenv.cfg
"""


@pytest.fixture(scope="module")
def ec2() -> Iterator[EC2Bed]:
    with ec2_bed(image_roots=True) as bed:
        yield bed


def node_tags() -> list[str]:
    """The runtime tag of a node of each image root, as clusterd's own probe finds it there
    (run in the root): its glibc, and its Python, or, where it has none usable, the
    uv-managed one of the daemon's minor it is to get."""
    roots = json.loads(subprocess.run([sys.executable, "-c", ROOTS], cwd=ROOT, check=True,
                                      capture_output=True, text=True, timeout=1800).stdout)
    tags = []
    for root in roots.values():
        said = subprocess.run(["chroot", root, "env", "-i", "PATH=/usr/bin:/bin", "sh", "-c",
                               probe_script()], capture_output=True, text=True, timeout=60)
        node = NodePlatform.parse(said.stdout)
        tags.append(node.target(node.python or PYTHON_TAG).tag)
    return tags


@pytest.fixture(scope="module")
def daemon(ec2: EC2Bed) -> Iterator[Daemon]:
    """A daemon in the bed, with no package index (the bed's namespace has no way out): the
    runtime for each image's kind of node is readied ahead, here, as README says to; and the
    Python mirror the nodes with no usable Python install from, on the bed's service address."""
    prepared = subprocess.run(
        [sys.executable, "-m", "clusterd", "--prepare-runtime",
         *(f"--prepare-runtime-for={tag}" for tag in node_tags())],
        env={**os.environ, "CLUSTERD_WHEELHOUSE_DIR": ec2.env["CLUSTERD_WHEELHOUSE_DIR"]},
        capture_output=True, text=True, timeout=1800)
    assert prepared.returncode == 0, prepared.stderr
    with python_mirror.serving_in(
            ec2.netns, MIRROR_HOST, MIRROR_PORT, old_glibc_archive()) as downloads, \
            running(ec2.daemon("cdimg-", CLUSTERD_PYTHON_DOWNLOADS_JSON_URL=downloads)) as daemon:
        yield daemon


def image_id(ec2: EC2Bed, image: tuple[str, str]) -> str:
    owner, name = image
    found: list[str] = json.loads(ec2.python(
        DESCRIBE.replace("OWNER", repr(owner)).replace("NAME", repr(name))))
    assert len(found) == 1, (image, found)
    return found[0]


def on_node(ec2: EC2Bed, instance_id: str, script: str) -> str:
    """Run script as root in the node's mount namespace (its root), from the bed's side."""
    (pid,) = [n["node_pid"] for n in ec2.nodes() if n["id"] == instance_id]
    done = subprocess.run(["nsenter", "--target", str(pid), "--mount", "--", "sh", "-c",
                           script], capture_output=True, text=True, timeout=60)
    return done.stdout + done.stderr


def boot(ec2: EC2Bed, image: str, instance_type: str = "t3.micro") -> str:
    """An instance of image, its node up; its id."""
    iid = ec2.python(RUN.replace("IMAGE", repr(image)).replace("TYPE", repr(instance_type)))
    iid = iid.strip()
    wait_for(lambda: any(n["id"] == iid and n["node"] == "up" for n in ec2.instances_now()),
             60, f"the node of {iid} ({image}) to come up")
    return iid


PROBE = ('. /etc/os-release; echo "codename=$VERSION_CODENAME"; '
         'echo "python=$(/usr/bin/python3 -c \'import sys; print(*sys.version_info[:2], '
         'sep=".")\')"; /usr/bin/python3 -m venv /tmp/probe-venv >/dev/null 2>&1 '
         '&& echo venv=yes || echo venv=no; id -u ubuntu; '
         'command -v nvidia-smi >/dev/null && nvidia-smi -L; '
         'command -v neuron-ls >/dev/null && neuron-ls -j; true')


def test_each_image_boots_in_its_own_root(ec2: EC2Bed) -> None:
    """What a node of each image is, seen from inside it; and what one node writes to its root
    stays on its own disk (not the image, not another node)."""
    jammy, noble, host = (boot(ec2, image_id(ec2, i)) for i in (JAMMY, NOBLE, HOST))
    seen = {name: on_node(ec2, iid, PROBE) for name, iid in
            (("jammy", jammy), ("noble", noble), ("host", host))}
    assert "codename=bullseye" in seen["jammy"] and "python=3.9" in seen["jammy"], seen
    assert "venv=no" in seen["jammy"], seen  # as Ubuntu 22.04 without python3-venv
    assert "codename=trixie" in seen["noble"] and "python=3.13" in seen["noble"], seen
    assert "venv=yes" in seen["noble"], seen
    assert f"codename={HOST_CODENAME}" in seen["host"], seen
    assert all("GPU " not in text for text in seen.values()), seen  # no driver on these
    on_node(ec2, jammy, "echo mine > /etc/clusterd-probe")
    assert on_node(ec2, jammy, "cat /etc/clusterd-probe").strip() == "mine"
    other = boot(ec2, image_id(ec2, JAMMY))
    assert "No such file" in on_node(ec2, other, "cat /etc/clusterd-probe")
    gpu = boot(ec2, image_id(ec2, DLAMI), "g5.xlarge")
    listed = on_node(ec2, gpu, "nvidia-smi -L")
    assert listed.startswith("GPU 0: NVIDIA A10G") and "GPU 1" not in listed, listed
    neuron = boot(ec2, image_id(ec2, NEURON), "inf2.xlarge")
    assert json.loads(on_node(ec2, neuron, "neuron-ls -j"))[0]["model"] == "Inferentia2"
    ec2.python("import boto3; boto3.client('ec2', region_name='us-east-1').terminate_instances("
               f"InstanceIds={[jammy, noble, host, other, gpu, neuron]!r})")


def two_node_job(ec2: EC2Bed, daemon: Daemon, cluster: str, image: tuple[str, str] | None,
                 codename: str, python_in: str) -> None:
    """A 2-node job on image (None: clusterd's default), whose runtime's Python is in the
    directory python_in names (its start, after the node's home)."""
    extra = f"  image_id: {image_id(ec2, image)}" if image else ""
    (daemon.root / f"{cluster}.yaml").write_text(TASK.format(extra=extra))
    try:
        result = daemon.ctl("launch", "-c", cluster, "--infra", "aws/us-east-1",
                            f"{cluster}.yaml", timeout=900)
        assert result.returncode == 0, (result.stderr + daemon.log()[-3000:]
                                        + ec2.node_logs(1500))
        lines = sorted(result.stdout.splitlines())
        homes = [line.split(" python in ", 1)[1] for line in lines if " python in " in line]
        assert [line for line in lines if " python in " not in line] == [
            f"(head, rank=0) rank=0 on {codename}",
            f"(worker1, rank=1) rank=1 on {codename}"], lines
        assert len(homes) == 2 and all(
            h.removeprefix(NODE_HOME).startswith(python_in) for h in homes), lines
    finally:
        daemon.ctl("down", "-y", cluster, timeout=600)


def test_two_node_job_on_the_default_image(ec2: EC2Bed, daemon: Daemon) -> None:
    """No image_id: clusterd's default, Ubuntu 22.04 by name, is the bullseye root here."""
    two_node_job(ec2, daemon, "jammy", None, "bullseye", f"/.clusterd/python/cpython-{PYTHON_TAG}")


def test_two_node_job_on_the_newer_python_image(ec2: EC2Bed, daemon: Daemon) -> None:
    """Python 3.13, not the daemon's: a venv of it, from wheels built for it (ahead)."""
    two_node_job(ec2, daemon, "noble", NOBLE, "trixie", "/usr/bin")


def test_two_node_job_on_the_host_like_image(ec2: EC2Bed, daemon: Daemon) -> None:
    two_node_job(ec2, daemon, "hostimg", HOST, HOST_CODENAME, "/")


GPU_TASK = """
name: gpu
resources:
  accelerators: A10G:1
{extra}
run: |
  echo "gpus=$SKYPILOT_NUM_GPUS_PER_NODE"; nvidia-smi -L
"""


def test_gpu_types_boot_the_gpu_image_and_refuse_one_without_a_driver(
        ec2: EC2Bed, daemon: Daemon) -> None:
    (daemon.root / "gpu.yaml").write_text(GPU_TASK.format(extra=""))
    try:
        result = daemon.ctl("launch", "-c", "gpu", "--infra", "aws/us-east-1", "gpu.yaml",
                            timeout=900)
        assert result.returncode == 0, result.stderr + daemon.log()[-3000:]
        assert "gpus=1" in result.stdout and "GPU 0: NVIDIA A10G" in result.stdout, result.stdout
        (instance,) = [i for i in ec2.instances(cloud_name(daemon, "gpu"))
                       if i["state"] == "running"]
        dlami = image_id(ec2, DLAMI)
        assert ec2.python(
            "import boto3; print(boto3.client('ec2', region_name='us-east-1').describe_instances("
            f"InstanceIds=[{instance['id']!r}])['Reservations'][0]['Instances'][0]['ImageId'])"
        ).strip() == dlami
    finally:
        daemon.ctl("down", "-y", "gpu", timeout=600)
    plain = image_id(ec2, HOST)
    (daemon.root / "nodriver.yaml").write_text(GPU_TASK.format(extra=f"  image_id: {plain}"))
    try:
        refused = daemon.ctl("launch", "-c", "nodriver", "--infra", "aws/us-east-1",
                             "nodriver.yaml", timeout=900)
        assert refused.returncode != 0, refused.stdout
        said = " ".join(refused.stderr.split())
        assert "no working NVIDIA driver" in said and plain in said, refused.stderr
        assert "Deep Learning Base GPU AMI" in said, refused.stderr
    finally:
        daemon.ctl("down", "-y", "nodriver", timeout=600)
