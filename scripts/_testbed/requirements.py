"""What the test beds need on the machine, installed by the beds themselves: on a machine that
only ran scripts/quickstart, `scripts/testbed up` and `scripts/testbed ec2 up` just work.

Debian packages go through scripts/_bootstrap.sh's apt_install (the one place the project
installs them); moto and boto3 go into the project's venv at the version pyproject.toml pins
for the dev extras. Standard library only.
"""

from __future__ import annotations

import os
import re
import subprocess
import tomllib

from _testbed.common import Failure, log

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
BOOTSTRAP = os.path.join(REPO, "scripts", "_bootstrap.sh")
PYPROJECT = os.path.join(REPO, "pyproject.toml")
INSTALL_TIMEOUT_S = 900.0

# What nodes run is the machine's own: sshd, rsync (workdirs, file mounts), python3 -m venv
# (the runtime), ps. The EC2 bed also makes namespaces and links (iproute2), enforces security
# groups (nftables), gives nodes sudo (which brings visudo, to check its sudoers file), and
# makes each instance's disk an ext4 image (e2fsprogs' mkfs.ext4; util-linux's losetup).
HOSTS_PACKAGES = ("openssh-server", "openssh-client", "rsync", "python3-venv", "procps")
EC2_PACKAGES = (*HOSTS_PACKAGES, "sudo", "iproute2", "nftables", "util-linux", "e2fsprogs")
# The EC2 bed's image roots (`ec2 up --image-roots`, `ec2 build-images`) are Debian suites
# debootstrap makes from Debian's archive (its keyring checks them).
DEBOOTSTRAP_PACKAGES = ("debootstrap", "debian-archive-keyring")
# The Kubernetes bed runs containers with Debian's runc and CNI plugins (containerd, Go and
# etcd it extracts into its cache without installing them), builds with gcc (the static pause
# needs libc6-dev), patch and openssl, makes its node image with debootstrap, and kube-proxy
# uses iptables and conntrack. socat and openssh-client: for reaching pods from the bed.
K8S_PACKAGES = ("iproute2", "util-linux", "nftables", "iptables", "conntrack", "runc",
                "containernetworking-plugins", "debootstrap", "socat", "openssl", "gcc",
                "libc6-dev", "patch", "xz-utils", "openssh-client", "rsync")


def installed(package: str) -> bool:
    p = subprocess.run(["dpkg-query", "-W", "-f=${Status}", package], capture_output=True,
                       text=True)
    return p.returncode == 0 and "install ok installed" in p.stdout


def ensure_debian_packages(packages: tuple[str, ...]) -> None:
    """Install the packages that are missing (apt-get, as root)."""
    missing = [p for p in packages if not installed(p)]
    if not missing:
        return
    log(f"installing {' '.join(missing)} (Debian packages the test bed needs) ...")
    try:
        p = subprocess.run(["bash", "-c", f'source "{BOOTSTRAP}" && apt_install "$@"', "bash",
                            *missing], stdin=subprocess.DEVNULL, capture_output=True,
                           text=True, timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise Failure(f"installing {' '.join(missing)} timed out") from e
    if p.returncode != 0:
        raise Failure(f"installing {' '.join(missing)} failed: "
                      f"{(p.stderr or p.stdout).strip()[-1500:]}",
                      hint=f"apt-get install {' '.join(missing)}")


def pinned(distribution: str) -> str:
    """The requirement pyproject.toml's dev extras give for distribution (e.g.
    "moto[server]==5.2.5"), or its bare name."""
    with open(PYPROJECT, "rb") as f:
        project = tomllib.load(f)["project"]
    for requirement in project.get("optional-dependencies", {}).get("dev", []):
        name = re.split(r"[\[<>=!~ ;]", requirement, maxsplit=1)[0]
        if name.lower() == distribution.lower():
            return str(requirement)
    return distribution


def ensure_venv_moto(venv_python: str) -> None:
    """moto's server and boto3 in the project's venv."""
    log(f"installing {pinned('moto')} into {os.path.dirname(os.path.dirname(venv_python))} "
        "(the EC2 test bed's API) ...")
    try:
        p = subprocess.run([venv_python, "-m", "pip", "install", "-q",
                            "--disable-pip-version-check", pinned("moto"), "boto3"],
                           stdin=subprocess.DEVNULL, capture_output=True, text=True,
                           timeout=INSTALL_TIMEOUT_S)
    except subprocess.TimeoutExpired as e:
        raise Failure("installing moto timed out") from e
    if p.returncode != 0:
        raise Failure(f"installing moto into the venv failed: {p.stderr.strip()[-1500:]}",
                      hint=f"{venv_python} -m pip install '{pinned('moto')}'")
