"""Fixtures of the end-to-end tests that several modules share."""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.e2e.ec2bed import EC2Bed, ec2_bed
from tests.e2e.k8sbed import K8sBed, k8s_bed


@pytest.fixture(scope="session")
def ec2() -> Iterator[EC2Bed]:
    """The EC2 test bed, made once for every module that needs it."""
    if os.getuid() != 0 or not Path("/usr/sbin/sshd").exists() or not shutil.which("sudo"):
        pytest.skip("the EC2 test bed needs root, openssh-server and sudo")
    with ec2_bed() as bed:
        yield bed


@pytest.fixture(scope="session")
def k8s() -> Iterator[K8sBed]:
    """The Kubernetes test bed, made once for every module that needs it."""
    if os.getuid() != 0 or not shutil.which("ip"):
        pytest.skip("the Kubernetes test bed needs root and iproute2")
    with k8s_bed() as bed:
        yield bed
