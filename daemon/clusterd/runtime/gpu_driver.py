"""That a node given GPUs can use them: its NVIDIA driver answers (`nvidia-smi -L` lists GPUs).

A GPU instance booted from an image without the driver (plain Ubuntu, or an `image_id` of the
user's without it) has the GPUs and no way to use them: Ray would count the GPUs the
instance type promises, the job would start and then fail in CUDA's first call with a message
about CUDA, not about the image. Checked before Ray starts on the node, so the launch fails
at once naming the driver, the node and its image, with what to do.
"""

from __future__ import annotations

from clusterctl.protocol import ErrorCode, ProtocolError
from clusterd.nodes import NodeInfo
from clusterd.runtime.runner import CommandRunner

CHECK_TIMEOUT_S = 60.0
# `nvidia-smi -L` prints "GPU 0: NAME (UUID: ...)" per GPU; without the driver it is missing
# (exit 127 from sh) or fails (NVIDIA-SMI has failed because it couldn't communicate with the
# NVIDIA driver).
_CHECK = 'command -v nvidia-smi >/dev/null 2>&1 || exit 127; exec nvidia-smi -L'


async def check(runner: CommandRunner, node: NodeInfo) -> int:
    """The number of GPUs the node's driver lists; ProtocolError if it has none or the
    driver does not answer. Call only for a node given GPUs (node.gpus > 0)."""
    found = await runner.run(["sh", "-c", _CHECK], timeout_s=CHECK_TIMEOUT_S)
    listed = [line for line in found.text.splitlines() if line.startswith("GPU ")]
    if found.exit_code == 0 and listed:
        return len(listed)
    image = f"image {node.image}" if node.image else "its image"
    if found.exit_code == 127:
        why = "there is no nvidia-smi: the image has no NVIDIA driver"
    elif found.exit_code == 0:
        why = "nvidia-smi lists no GPU"
    else:
        why = f"nvidia-smi fails: {found.error_tail(3)}"
    raise ProtocolError(
        ErrorCode.PROVIDER_ERROR,
        f"{runner.node_name} has {node.gpus:g} GPU(s) but no working NVIDIA driver ({why}; "
        f"{image})",
        "launch GPU instance types on an image with the NVIDIA driver: leave resources."
        "image_id unset (clusterd then picks AWS's Deep Learning Base GPU AMI for them), or "
        "name one with the driver installed")
