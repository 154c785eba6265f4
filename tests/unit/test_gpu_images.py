"""GPU and Neuron instance types get images with their drivers by default, and a node given
GPUs without a driver is refused naming the driver and the image (runtime/gpu_driver.py, on
this machine through the local runner: a real `sh`, and a real program on PATH or none)."""

from __future__ import annotations

import os
from pathlib import Path

import anyio
import pytest

from clusterctl.protocol import ProtocolError
from clusterd.nodes import NodeInfo, NodeStatus
from clusterd.providers.aws.images import IMAGE_NAMES, ImageKind, default_image_kind
from clusterd.runtime import gpu_driver
from clusterd.runtime.runner import LocalRunner


def test_the_default_image_follows_the_accelerator() -> None:
    assert default_image_kind(None) is ImageKind.UBUNTU
    assert default_image_kind("A100") is ImageKind.NVIDIA
    assert default_image_kind("A10G") is ImageKind.NVIDIA
    assert default_image_kind("Inferentia2") is ImageKind.NEURON
    assert default_image_kind("Trainium") is ImageKind.NEURON
    assert IMAGE_NAMES[ImageKind.NVIDIA].owner == "amazon"
    assert IMAGE_NAMES[ImageKind.NVIDIA].pattern("amd64") == (
        "Deep Learning Base OSS Nvidia Driver GPU AMI (Ubuntu 22.04) *")
    assert IMAGE_NAMES[ImageKind.NEURON].pattern("arm64") is None  # Neuron is x86 only


NODE = NodeInfo("i-0abc", "10.0.0.5", NodeStatus.RUNNING, gpus=2, image="ami-0123456789abcdef0",
                check_gpu_driver=True)


def runner_with(tmp_path: Path, program: str | None) -> LocalRunner:
    """A runner whose PATH has only the shell's tools and, if given, an nvidia-smi."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    if program is not None:
        smi = bin_dir / "nvidia-smi"
        smi.write_text(program)
        smi.chmod(0o755)
    return LocalRunner("i-0abc", env={"PATH": f"{bin_dir}:/usr/bin:/bin"})


def check(runner: LocalRunner) -> int:
    return anyio.run(gpu_driver.check, runner, NODE)


def test_a_node_without_the_driver_is_refused_naming_it_and_the_image(tmp_path: Path) -> None:
    assert not any(os.access(os.path.join(d, "nvidia-smi"), os.X_OK)
                   for d in ("/usr/bin", "/bin"))
    with pytest.raises(ProtocolError) as refused:
        check(runner_with(tmp_path, None))
    assert "i-0abc has 2 GPU(s) but no working NVIDIA driver" in refused.value.message
    assert "no nvidia-smi" in refused.value.message
    assert "ami-0123456789abcdef0" in refused.value.message
    assert "Deep Learning Base GPU AMI" in (refused.value.hint or "")


def test_a_driver_that_fails_is_named_with_its_words(tmp_path: Path) -> None:
    broken = ("#!/bin/sh\necho \"NVIDIA-SMI has failed because it couldn't communicate with "
              "the NVIDIA driver\" >&2\nexit 9\n")
    with pytest.raises(ProtocolError) as refused:
        check(runner_with(tmp_path, broken))
    assert "couldn't communicate with the NVIDIA driver" in refused.value.message


def test_a_working_driver_passes(tmp_path: Path) -> None:
    listing = ("#!/bin/sh\necho 'GPU 0: NVIDIA A10G (UUID: x)'\n"
               "echo 'GPU 1: NVIDIA A10G (UUID: y)'\n")
    assert check(runner_with(tmp_path, listing)) == 2
