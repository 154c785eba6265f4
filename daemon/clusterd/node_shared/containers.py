"""Jobs in a container (SkyPilot's `image_id: docker:IMAGE`), on nodes that have a runtime.

The node's own runtime runs the job's scripts in the image: docker if its daemon answers, else
podman. The container shares the node's network (Ray, the other nodes, the ports the task
opened) and sees the job's working directory at the same path. The job's environment reaches
it by name only (`-e NAME`, the value taken from the runtime's own environment), so no value,
secrets included, is ever on a command line.
"""

from __future__ import annotations

import re
import shutil
import subprocess

DOCKER_PREFIX = "docker:"
RUNTIMES = ("docker", "podman")
PROBE_TIMEOUT_S = 60.0  # a job refused for a slow probe is worse than a slow start
# Bash where the image has it (SkyPilot's scripts assume it), else its sh.
SHELL = 'if command -v bash >/dev/null 2>&1; then exec bash "$0"; else exec sh "$0"; fi'


# An image reference, by the grammar docker and podman share (distribution's reference/regexp.go):
# [host[:port]/]path[:tag][@digest]. Anything else (an option such as `--cidfile=...`, spaces,
# shell syntax) is refused before it reaches a command line.
_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_HOST = rf"(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[a-fA-F0-9:]+\])"
_PATH_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
IMAGE_REFERENCE = re.compile(
    rf"(?P<name>(?:{_HOST}(?::[0-9]+)?/)?{_PATH_COMPONENT}(?:/{_PATH_COMPONENT})*)"
    r"(?::[\w][\w.-]{0,127})?"
    r"(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?",
    re.ASCII,  # \w in a tag is ASCII only
)
MAX_NAME_CHARS = 255


class BadImage(ValueError):
    """Not an image reference docker or podman would take as one."""


def check_image(image: str) -> str:
    """`image` if it is an image reference (name[:tag][@digest]); else BadImage saying so."""
    match = IMAGE_REFERENCE.fullmatch(image)
    if match is None or len(match["name"]) > MAX_NAME_CHARS:
        shown = image if len(image) <= 80 else image[:80] + "..."
        raise BadImage(
            f"{shown!r} is not an image reference: [HOST[:PORT]/]NAME[:TAG][@DIGEST], with "
            f"NAME in lower case (e.g. ubuntu:22.04, ghcr.io/org/image@sha256:...)")
    return image


def image_of(image_id: str | None) -> str | None:
    """The container image a task's image_id names, or None (not a docker image)."""
    if image_id and image_id.startswith(DOCKER_PREFIX):
        return image_id[len(DOCKER_PREFIX):].strip() or None
    return None


def find_runtime() -> tuple[str | None, str]:
    """The first runtime on this node that answers (`docker version`, `podman version`: they
    reach docker's daemon but not podman's storage, which `info` waits on while another
    podman holds it, a tenth of a second here and seconds on a busy node), and if none does,
    why (for the refusal)."""
    problems = []
    for name in RUNTIMES:
        path = shutil.which(name)
        if path is None:
            problems.append(f"no {name}")
            continue
        try:
            done = subprocess.run([path, "version"], stdin=subprocess.DEVNULL,
                                  capture_output=True, text=True, timeout=PROBE_TIMEOUT_S)
        except (OSError, subprocess.TimeoutExpired) as exc:
            problems.append(f"{name}: {exc}")
            continue
        if done.returncode == 0:
            return path, ""
        last = (done.stderr or done.stdout).strip().splitlines()
        problems.append(f"{name} does not answer ({last[-1][:160] if last else 'no output'})")
    return None, "; ".join(problems)


def command(runtime: str, image: str, script_path: str, workdir: str,
            env_names: list[str]) -> list[str]:
    """The runtime's argv that runs the script file in the image. BadImage unless `image`
    is an image reference; and `--` ends the options, so nothing after is taken for one."""
    check_image(image)
    argv = [runtime, "run", "--rm", "--network", "host",
            "-v", f"{workdir}:{workdir}", "-v", f"{script_path}:{script_path}:ro",
            "-w", workdir]
    for name in sorted(env_names):
        argv += ["-e", name]
    return [*argv, "--", image, "sh", "-c", SHELL, script_path]
