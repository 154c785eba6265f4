"""Failover between clouds on the two beds at once: one daemon in the EC2 bed's namespace that
also reaches the Kubernetes bed's API server, so an `ordered` list can go from aws to
kubernetes and back.

The beds stay what they are, each in a namespace of its own with no link out. The one way
between them is the API server's, carried over a Unix socket (a file, not a network): socat
serves it in the Kubernetes bed, and another socat forwards 127.0.0.1:PORT in the EC2 bed's
namespace to it, where the kubeconfig's server address points. SSH to the pods goes through
the API server's port-forward (SkyPilot's default), so that is all the daemon needs.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from tests.e2e.ec2bed import EC2Bed, running
from tests.e2e.k8sbed import K8sBed
from tests.e2e.test_failover import attempts, launch
from tests.support import Daemon, needs_tool, short_tempdir, wait_for

pytestmark = [pytest.mark.ec2, pytest.mark.k8s, pytest.mark.ray]


@contextlib.contextmanager
def api_relay(ec2: EC2Bed, k8s: K8sBed) -> Iterator[None]:
    """The Kubernetes API server at its kubeconfig address inside the EC2 bed's namespace."""
    needs_tool("socat", "socat")
    kubeconfig = yaml.safe_load(Path(k8s.env["KUBECONFIG"]).read_text())
    server = urlsplit(kubeconfig["clusters"][0]["cluster"]["server"])
    assert server.hostname == "127.0.0.1" and server.port
    directory = short_tempdir("cdrelay-")
    sock = directory / "api.sock"
    serve = subprocess.Popen(["ip", "netns", "exec", k8s.netns, "socat",
                              f"UNIX-LISTEN:{sock},fork,mode=600",
                              f"TCP:127.0.0.1:{server.port}"])
    forward: subprocess.Popen[bytes] | None = None
    try:
        wait_for(sock.exists, 10, "the relay's socket")
        forward = subprocess.Popen(["ip", "netns", "exec", ec2.netns, "socat",
                                    f"TCP-LISTEN:{server.port},bind=127.0.0.1,reuseaddr,fork",
                                    f"UNIX-CONNECT:{sock}"])
        yield
    finally:
        for process in (forward, serve):
            if process is not None:
                process.terminate()
                process.wait(10)
        shutil.rmtree(directory, ignore_errors=True)


@pytest.fixture(scope="module")
def both(ec2: EC2Bed, k8s: K8sBed) -> Iterator[Daemon]:
    with api_relay(ec2, k8s):
        config = short_tempdir("cdxc-") / "config.yaml"
        config.write_text(Path(ec2.env["CLUSTERD_CONFIG"]).read_text() + (
            "\nkubernetes:\n  allowed_contexts: [bed-a, bed-b]\n"
            f"  image: {k8s.image}\n  image_pull_policy: Never\n  provision_timeout: 5\n"))
        daemon = ec2.daemon("cdxf-", CLUSTERD_CONFIG=str(config),
                            KUBECONFIG=k8s.env["KUBECONFIG"])
        with running(daemon):
            check = daemon.ctl("check", "--json")
            assert check.returncode == 0 and '"bed-a (' in check.stdout, check.stdout
            yield daemon
        shutil.rmtree(config.parent, ignore_errors=True)


@pytest.fixture(autouse=True)
def no_faults(ec2: EC2Bed, k8s: K8sBed) -> Iterator[None]:
    ec2.clear_faults()
    yield
    ec2.clear_faults()
    k8s.ok("quota", "--pods", "20")


def aws_alternative(ec2: EC2Bed) -> str:
    images = "".join(f"        {region}: {ami}\n" for region, ami in
                     ec2.runtime_images().items())
    return ("    - infra: aws/us-east-1\n      cpus: 2\n"
            + (f"      image_id:\n{images}" if images else ""))


K8S_ALTERNATIVE = "    - infra: kubernetes/{context}\n      cpus: 0.5\n      memory: 1\n"


def test_aws_out_of_quota_fails_over_to_kubernetes(ec2: EC2Bed, k8s: K8sBed,
                                                   both: Daemon) -> None:
    ec2.fault("--code", "VcpuLimitExceeded", "--region", "us-east-1", "--action",
              "RunInstances")
    task = ("resources:\n  ordered:\n" + aws_alternative(ec2)
            + K8S_ALTERNATIVE.format(context="bed-a") + "run: echo landed on $(hostname)\n")
    result = launch(both, "a2k", task)
    assert result.returncode == 0, result.stderr + both.log()[-3000:]
    tried = attempts(result.stderr)
    assert len(tried) == 1 and "VcpuLimitExceeded" in tried[0], tried
    assert tried[0].endswith("— trying kubernetes/bed-a"), tried
    row = both.cluster("a2k")
    assert row is not None and row["infra"] == "kubernetes/bed-a"
    (pod,) = k8s.pods(row["cloud_name"])
    assert f"landed on {pod['metadata']['name']}" in result.stdout
    assert both.ctl("down", "-y", "a2k").returncode == 0
    assert k8s.leftovers(row["cloud_name"]) == []


def test_kubernetes_out_of_quota_fails_over_to_aws(ec2: EC2Bed, k8s: K8sBed,
                                                   both: Daemon) -> None:
    k8s.ok("quota", "--pods", "0")
    task = ("resources:\n  ordered:\n" + K8S_ALTERNATIVE.format(context="bed-b")
            + aws_alternative(ec2) + "run: echo landed\n")
    result = launch(both, "k2a", task)
    assert result.returncode == 0, result.stderr + both.log()[-3000:]
    tried = attempts(result.stderr)
    assert len(tried) == 1 and "exceeded quota" in tried[0], tried
    row = both.cluster("k2a")
    assert row is not None and row["infra"].startswith("aws/us-east-1/"), row
    assert k8s.leftovers(row["cloud_name"]) == []  # the failed attempt left no pod
    assert "landed" in result.stdout
    assert both.ctl("down", "-y", "k2a", timeout=600).returncode == 0
    assert ec2.leftovers(row["cloud_name"]) == []


def test_a_bucket_mount_on_pods_without_fuse_fails_the_launch_and_leaves_nothing(
        ec2: EC2Bed, k8s: K8sBed, both: Daemon) -> None:
    """The bed's pods have no /dev/fuse (as most pods): a MOUNT entry cannot be had there. The
    new cluster goes with its failed launch, and so does the bucket made for it."""
    bucket = f"nofuse-{uuid.uuid4().hex[:8]}"
    task = ("resources:\n  infra: kubernetes/bed-a\n  cpus: 0.5\n  memory: 1\n"
            f"file_mounts:\n  /ckpt:\n    name: {bucket}\n    mode: MOUNT\n"
            "    persistent: false\nrun: echo never ran\n")
    result = launch(both, "nofuse", task)
    assert result.returncode != 0, result.stdout
    assert f"file_mounts./ckpt: MOUNT of s3://{bucket} on " in result.stderr, result.stderr
    assert "has no /dev/fuse" in result.stderr and "mode: COPY" in result.stderr
    assert "never ran" not in result.stdout
    assert both.cluster("nofuse") is None
    wait_for(lambda: "nofuse" not in k8s.kubectl("get", "pods", "--all-namespaces", "-o",
                                                 "name"), 120, "the cluster's pods to go")
    exists = ec2.python("import boto3; print([b['Name'] for b in "
                        "boto3.client('s3').list_buckets()['Buckets']])")
    assert bucket not in exists
