"""Where the EC2 test bed keeps things, its state file, and the environment clients get.
Shared by the command line and the controller. Standard library only."""

from __future__ import annotations

import dataclasses
import json
import os
from collections.abc import Mapping
from typing import Any

from _testbed.common import Failure, read_text, write_file

# scripts/_testbed/ec2/layout.py -> the repository
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))))
SCRIPTS = os.path.join(REPO, "scripts")
VENV_BIN = os.path.join(REPO, ".venv", "bin")
VENV_PYTHON = os.path.join(VENV_BIN, "python")

DEFAULT_DIR = "/tmp/clusterd-ec2"
DEFAULT_NETNS = "clusterd-ec2"
DEFAULT_REGIONS = ("us-east-1", "us-west-2")

API_IP, API_PORT = "127.0.0.1", 4566  # what clients call
MOTO_IP, MOTO_PORT = "127.0.0.1", 5000  # moto itself; only the controller calls it directly
API_URL = f"http://{API_IP}:{API_PORT}"
# The bed's address nodes reach it on, through their VPC's gateway (node_init routes it); the
# API answers here too, so S3 (AWS_ENDPOINT_URL_S3) is one address for the daemon and nodes.
SERVICE_IP = "127.254.0.1"
NODE_API_URL = f"http://{SERVICE_IP}:{API_PORT}"
MOTO_URL = f"http://{MOTO_IP}:{MOTO_PORT}"
ACCOUNT_ID = "123456789012"  # moto's default account
# Throw-away keys: moto checks no signatures; they only have to look like keys.
ACCESS_KEY_ID = "AKIATESTBED000000000"
SECRET_ACCESS_KEY = "clusterd-testbed-not-a-secret"

NODE_USER = "ubuntu"
NODE_HOME = "/home/ubuntu"
NODE_MOUNT = "/run/clusterd-testbed-node"  # an instance's control directory, on the node
NODE_DISK = "/run/clusterd-testbed-disk"  # where a node mounts its disk (disk.py)
SHUTDOWN_REQUEST = "shutdown-request"  # written there by the shutdown stubs
NODE_READY = "ready"  # written there by the node's init once its sshd answers
VPC_NAME = "clusterd-testbed"

STATE_FILE = "state.json"
CONTROLLER_MODULE = "_testbed.ec2.controller"
NODE_INIT_MODULE = "_testbed.ec2.node_init"
RUNTIME_IMAGE_MODULE = "_testbed.ec2.runtime_image"

# The runtime image (`ec2 up --runtime-image`): an AMI of this name per region, whose instances
# start with the runtime of wheelhouse KEY installed; its ids, {region: id} as JSON, in this
# variable of clients' environment.
RUNTIME_IMAGE_PREFIX = "clusterd-testbed-runtime-"
RUNTIME_IMAGES_ENV = "CLUSTERD_TESTBED_RUNTIME_IMAGES"
READY_MARKER = ".clusterd-ready"  # what clusterd's install_runtime looks for in a venv

# Cleared from clients' environment: nothing may reach a real account by accident.
REMOVED_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE",
               "AWS_DEFAULT_PROFILE", "AWS_ENDPOINT_URL", "AWS_REGION", "AWS_DEFAULT_REGION")
CLUSTERD_YAML = "aws:\n  vpc_name: clusterd-testbed\n  use_internal_ips: true\n"


def runtime_image_name(key: str) -> str:
    return RUNTIME_IMAGE_PREFIX + key


def runtime_venv(key: str) -> str:
    """The runtime's venv, relative to the node's home (as clusterd's install_runtime makes it)."""
    return os.path.join(".clusterd", "venvs", key)


def default_dir() -> str:
    return os.environ.get("CLUSTERD_TESTBED_EC2_DIR") or DEFAULT_DIR


def default_netns() -> str:
    return os.environ.get("CLUSTERD_TESTBED_EC2_NETNS") or DEFAULT_NETNS


@dataclasses.dataclass(frozen=True)
class InstancePaths:
    """One instance's files. `disk` is its disk, an ext4 image holding its /home/ubuntu and
    /tmp (disk.py: kept across stop/start, deleted with the instance); `control` is mounted on
    NODE_MOUNT on the node and holds its sshd's config and host key and the shutdown
    requests."""

    root: str

    @property
    def disk(self) -> str:
        return os.path.join(self.root, "disk.ext4")

    @property
    def control(self) -> str:
        return os.path.join(self.root, "control")

    @property
    def sshd_config(self) -> str:
        return os.path.join(self.control, "sshd_config")

    @property
    def driver_bin(self) -> str:
        """The stand-in driver programs of an instance of a GPU or Neuron image (drivers.py),
        shown in its /usr/local/bin."""
        return os.path.join(self.root, "driver-bin")

    @property
    def host_key(self) -> str:
        return os.path.join(self.control, "ssh_host_ed25519_key")

    @property
    def shutdown_request(self) -> str:
        return os.path.join(self.control, SHUTDOWN_REQUEST)

    @property
    def ready(self) -> str:
        """Written by the node once its sshd of this boot answers."""
        return os.path.join(self.control, NODE_READY)

    @property
    def node_pid(self) -> str:
        return os.path.join(self.root, "node.pid")

    @property
    def node_log(self) -> str:
        return os.path.join(self.root, "node.log")


@dataclasses.dataclass(frozen=True)
class BedPaths:
    dir: str

    def _p(self, *parts: str) -> str:
        return os.path.join(self.dir, *parts)

    @property
    def state(self) -> str:
        return self._p(STATE_FILE)

    @property
    def control_sock(self) -> str:
        return self._p("control.sock")

    @property
    def controller_log(self) -> str:
        return self._p("controller.log")

    @property
    def aws_config(self) -> str:
        return self._p("aws", "config")

    @property
    def aws_credentials(self) -> str:
        return self._p("aws", "credentials")

    @property
    def admin_credentials(self) -> str:
        """With --iam: keys allowed everything, for looks behind clusterd's back."""
        return self._p("aws", "admin-credentials")

    @property
    def clusterd_yaml(self) -> str:
        return self._p("clusterd.yaml")

    @property
    def wheelhouse(self) -> str:
        return self._p("wheelhouse")

    @property
    def images(self) -> str:
        return self._p("images")

    def runtime_template(self, key: str) -> str:
        """The home directory instances of the runtime image KEY start from (copied onto their
        disks)."""
        assert "/" not in key and key not in ("", ".", "..")
        return self._p("images", f"runtime-{key}", "home")

    @property
    def client(self) -> str:
        return self._p("client")

    @property
    def node_sbin(self) -> str:
        """The shutdown stubs, mounted on /usr/local/sbin on every node."""
        return self._p("node-sbin")

    @property
    def instances(self) -> str:
        return self._p("instances")

    def instance(self, instance_id: str) -> InstancePaths:
        assert "/" not in instance_id and instance_id not in ("", ".", "..")
        return InstancePaths(self._p("instances", instance_id))


def load_state(paths: BedPaths) -> dict[str, Any] | None:
    """The bed's state file: {"version", "dir", "netns", "regions", "controller_pid"}, and once
    built "runtime_image": {"key", "template", "images": {region: AMI id}}."""
    text = read_text(paths.state)
    if text is None:
        return None
    try:
        state = json.loads(text)
    except ValueError as e:
        raise Failure(f"{paths.state} is not valid JSON: {e}") from e
    if not isinstance(state, dict) or not isinstance(state.get("regions"), list):
        raise Failure(f"{paths.state} is not an EC2 test bed state file")
    return state


def save_state(paths: BedPaths, state: dict[str, Any]) -> None:
    write_file(paths.state, json.dumps(state, indent=2) + "\n", 0o644)


def runtime_images(state: Mapping[str, Any] | None) -> dict[str, str]:
    """{region: AMI id} of the bed's runtime image ({} when it has none)."""
    image = (state or {}).get("runtime_image") or {}
    return dict(image.get("images") or {})


def bed_env(paths: BedPaths, base: Mapping[str, str],
            state: Mapping[str, Any] | None = None) -> dict[str, str]:
    """The environment of a process run in the bed: base without the AWS settings that could
    point elsewhere, plus the bed's endpoint, config, credentials, clusterd settings, the project's
    venv on PATH, (unless CLUSTERD_TESTBED_KEEP_XDG=1) XDG directories of the bed's own and, when
    state has a runtime image, RUNTIME_IMAGES_ENV."""
    env = {k: v for k, v in base.items() if k not in REMOVED_ENV and k != RUNTIME_IMAGES_ENV}
    images = runtime_images(state)
    if images:
        env[RUNTIME_IMAGES_ENV] = json.dumps(images, sort_keys=True)
    env.update({
        "AWS_ENDPOINT_URL_EC2": API_URL,
        "AWS_ENDPOINT_URL_STS": API_URL,
        "AWS_ENDPOINT_URL_S3": NODE_API_URL,
        "AWS_ENDPOINT_URL_IAM": API_URL,
        "AWS_CONFIG_FILE": paths.aws_config,
        "AWS_SHARED_CREDENTIALS_FILE": paths.aws_credentials,
        "AWS_EC2_METADATA_DISABLED": "true",
        "CLUSTERD_TESTBED_EC2_DIR": paths.dir,
    })
    env.setdefault("CLUSTERD_CONFIG", paths.clusterd_yaml)
    env.setdefault("CLUSTERD_WHEELHOUSE_DIR", paths.wheelhouse)
    rest = [p for p in env.get("PATH", "/usr/local/bin:/usr/bin:/bin").split(":")
            if p and p != VENV_BIN]
    env["PATH"] = ":".join([VENV_BIN, *rest])
    if base.get("CLUSTERD_TESTBED_KEEP_XDG") != "1":
        env["XDG_RUNTIME_DIR"] = os.path.join(paths.client, "run")
        env["XDG_STATE_HOME"] = os.path.join(paths.client, "state")
        env["XDG_CONFIG_HOME"] = os.path.join(paths.client, "config")
    return env


def aws_config_text(default_region: str) -> str:
    return f"[default]\nregion = {default_region}\n"


def aws_credentials_text() -> str:
    return (f"[default]\naws_access_key_id = {ACCESS_KEY_ID}\n"
            f"aws_secret_access_key = {SECRET_ACCESS_KEY}\n")
